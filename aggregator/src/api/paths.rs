//! The path parameters of the routes, one type per shape: each deserializes from the
//! route's named parameters, checks every name the way the whole API does (a bad
//! one answers 400 naming the parameter), and documents itself in the OpenAPI
//! document, so a route's path, its checks and its documentation cannot disagree.

use axum::extract::rejection::PathRejection;
use axum::extract::{FromRequestParts, Path};
use axum::http::request::Parts;
use meshcat_common::validate::{self, MAX_TEXT_LEN, is_valid_name};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use utoipa::IntoParams;

use super::error::ApiError;

/// Path parameters of type `T`, deserialized and checked; rejections become a 400
/// error body.
pub struct Valid<T>(pub T);

/// A path shape whose names are checked once deserialized.
pub trait PathNames: DeserializeOwned + Send {
    fn check(&self) -> Result<(), ApiError>;
}

impl<S: Send + Sync, T: PathNames> FromRequestParts<S> for Valid<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let v = match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(v)) => v,
            Err(e @ PathRejection::FailedToDeserializePathParams(_)) => {
                return Err(ApiError::bad_path(format!(
                    "The path is malformed: {}.",
                    e.body_text()
                )));
            }
            Err(_) => return Err(ApiError::bad_path("The path is malformed.")),
        };
        v.check()?;
        Ok(Valid(v))
    }
}

/// `{zoneName}`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Path, rename_all = "camelCase")]
pub struct ZonePath {
    /// The zone's zoneName.
    pub zone_name: String,
}

impl PathNames for ZonePath {
    fn check(&self) -> Result<(), ApiError> {
        name("zoneName", &self.zone_name)
    }
}

/// `{clusterName}`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Path, rename_all = "camelCase")]
pub struct ClusterPath {
    /// The cluster's clusterName.
    pub cluster_name: String,
}

impl PathNames for ClusterPath {
    fn check(&self) -> Result<(), ApiError> {
        name("clusterName", &self.cluster_name)
    }
}

/// `{zoneName}/clusters/{clusterName}`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Path, rename_all = "camelCase")]
pub struct ZoneClusterPath {
    /// The zone's zoneName.
    pub zone_name: String,
    /// The cluster's clusterName.
    pub cluster_name: String,
}

impl PathNames for ZoneClusterPath {
    fn check(&self) -> Result<(), ApiError> {
        name("zoneName", &self.zone_name)?;
        name("clusterName", &self.cluster_name)
    }
}

/// `{zoneName}/clusters/{clusterName}/instances/{instanceId}`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Path, rename_all = "camelCase")]
pub struct InstancePath {
    /// The zone's zoneName.
    pub zone_name: String,
    /// The cluster's clusterName.
    pub cluster_name: String,
    /// The instance name.
    pub instance_id: String,
}

impl PathNames for InstancePath {
    fn check(&self) -> Result<(), ApiError> {
        name("zoneName", &self.zone_name)?;
        name("clusterName", &self.cluster_name)?;
        instance(&self.instance_id)
    }
}

/// `/metrics/{clusterName}/{instanceId}`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Path, rename_all = "camelCase")]
pub struct MetricsPath {
    /// The cluster's clusterName.
    pub cluster_name: String,
    /// The instance name.
    pub instance_id: String,
}

impl PathNames for MetricsPath {
    fn check(&self) -> Result<(), ApiError> {
        name("clusterName", &self.cluster_name)?;
        instance(&self.instance_id)
    }
}

/// `/metrics/{name}/{version}/{instanceId}`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Path, rename_all = "camelCase")]
pub struct MetricsByVersionPath {
    /// The cluster's name field.
    pub name: String,
    /// The cluster's version field.
    pub version: String,
    /// The instance name.
    pub instance_id: String,
}

impl PathNames for MetricsByVersionPath {
    fn check(&self) -> Result<(), ApiError> {
        text("name", &self.name)?;
        text("version", &self.version)?;
        instance(&self.instance_id)
    }
}

fn name(what: &str, v: &str) -> Result<(), ApiError> {
    if is_valid_name(v) {
        Ok(())
    } else {
        Err(ApiError::bad_path(format!(
            "{what} in the path must be 1 to 253 characters of letters, digits, '.', '_' and '-'."
        )))
    }
}

fn instance(v: &str) -> Result<(), ApiError> {
    if validate::is_valid_instance(v) {
        Ok(())
    } else {
        Err(ApiError::bad_path(
            "instanceId in the path must be 1 to 253 printable characters without '/' or spaces.",
        ))
    }
}

fn text(what: &str, v: &str) -> Result<(), ApiError> {
    if v.is_empty() || v.len() > MAX_TEXT_LEN {
        Err(ApiError::bad_path(format!(
            "{what} in the path must be 1 to {MAX_TEXT_LEN} bytes long."
        )))
    } else {
        Ok(())
    }
}
