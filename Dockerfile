# meshcat container image: both binaries, meshcat-aggregator and meshcat-agent, in one
# small Debian runtime. The default entry point is the aggregator; the agent manifests
# set `command: ["meshcat-agent"]`.
#
#   docker build -t meshcat:latest .
#
# Stage 1 compiles the workspace in release mode; stage 2 copies only the binaries.

FROM rust:1-slim-bookworm AS builder
WORKDIR /src
# Manifests and sources; .dockerignore keeps target/, .venv/ and local state out.
COPY . .
# protoc: the etcd client compiles etcd's protobuf definitions at build time.
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends protobuf-compiler libprotobuf-dev \
    && rm -rf /var/lib/apt/lists/*
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p meshcat-aggregator -p meshcat-agent \
    && install -D -m 0755 target/release/meshcat-aggregator /out/meshcat-aggregator \
    && install -D -m 0755 target/release/meshcat-agent /out/meshcat-agent

FROM debian:bookworm-slim AS runtime
# ca-certificates: agents may be pointed at an aggregator whose certificate chains to a
# public root; tini is not needed, both binaries handle SIGTERM themselves.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 65532 meshcat \
    && useradd --system --uid 65532 --gid 65532 --home-dir /var/lib/meshcat --no-create-home meshcat \
    && install -d -o 65532 -g 65532 -m 0750 /var/lib/meshcat
COPY --from=builder /out/meshcat-aggregator /out/meshcat-agent /usr/local/bin/
USER 65532:65532
WORKDIR /var/lib/meshcat
# api, agent ingest (QUIC over UDP), aggregator ops, agent ops
EXPOSE 9080/tcp 9443/udp 9091/tcp 9092/tcp
ENV MESHCAT_DATA_DIR=/var/lib/meshcat
ENTRYPOINT ["/usr/local/bin/meshcat-aggregator"]
CMD ["serve"]
