//! The scrape's reading of `GET /clusters?format=json`: each upstream cluster's name,
//! whether it came from CDS, and its hosts' addresses and health, as the wire reports
//! them ([`ReportedCluster`]).
//!
//! A sidecar that knows every cluster of a large mesh answers with tens of megabytes
//! (85 MB for 20,000 clusters of 5 hosts, docs/benchmarks.md), most of it the hosts'
//! counters, which the report does not carry. So the answer is never held whole nor
//! turned into a tree: [`ClustersReader`] is fed it chunk by chunk as it arrives,
//! follows the JSON structure only along the path to the fields it keeps, and passes
//! over everything else (counters, circuit breakers, localities) counting brackets
//! and quotes. What it holds is the reported clusters and at most one JSON token cut
//! by a chunk's end.
//!
//! Every token it reads (keys, and the values of the objects and arrays it follows)
//! is checked as JSON: a fault there is an error. A value passed over is checked only
//! for balanced brackets of its own kind and balanced strings: a fault inside it is
//! an error or goes unseen, and never changes what is read (the differential tests,
//! `clusters/differential.rs`, hold it to both).

use std::borrow::Cow;

use meshcat_common::limits::{MAX_UPSTREAM_CLUSTERS, MAX_UPSTREAM_HOSTS};
use meshcat_common::wire::{ReportedCluster, hosts_digest};

use super::EnvoyError;

/// Most clusters read from one `/clusters` answer: four times what the aggregator
/// takes by default, so that an operator can raise its `--max-upstream-clusters`
/// that far; a sidecar with more is reported unreachable with the reason.
pub const MAX_READ_CLUSTERS: usize = 4 * MAX_UPSTREAM_CLUSTERS;
/// Most hosts (over all clusters) read from one `/clusters` answer, for the same
/// reason: they are what the reader keeps (about 50 bytes each).
pub const MAX_READ_HOSTS: usize = 4 * MAX_UPSTREAM_HOSTS;
/// Most bytes of names and addresses kept from one `/clusters` answer (a sidecar
/// with 20,000 clusters of 5 hosts has about 3 MB of them).
pub const MAX_READ_TEXT: usize = 16 << 20;
/// Longest JSON token (a string with its quotes, a number) the reader takes: cluster
/// names and addresses are far shorter.
const MAX_TOKEN: usize = 64 << 10;

/// What an open object or array of the answer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ctx {
    /// The answer itself.
    Root,
    /// `cluster_statuses`.
    Clusters,
    /// One of them.
    Cluster,
    /// Its `host_statuses`.
    Hosts,
    /// One of them.
    Host,
    /// Its `address`.
    Address,
    /// `address.socket_address`.
    Socket,
    /// `address.pipe`.
    Pipe,
    /// The host's `health_status`.
    Health,
}

/// What the value about to be read is, from its key (or its array).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    /// Anything the report does not carry.
    Other,
    /// An element of an array.
    Element,
    ClusterStatuses,
    Name,
    AddedViaApi,
    HostStatuses,
    Address,
    SocketAddress,
    Pipe,
    Ip,
    Port,
    Path,
    HealthStatus,
    EdsHealth,
    /// Any other key of `health_status`: a failed health flag when `true`.
    HealthFlag,
}

/// The next token the grammar allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Value,
    /// After `[`: a value or `]`.
    ValueOrEnd,
    /// After `,` in an object.
    Key,
    /// After `{`: a key or `}`.
    KeyOrEnd,
    Colon,
    /// After a value: `,` or the end of its container.
    CommaOrEnd,
    /// The answer's object is complete: only white space may follow.
    Done,
}

/// A token cut by the end of a chunk, kept in `carry` until the next one ends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Partial {
    None,
    /// A string; whether its last byte so far is an escaping backslash.
    Str {
        escaped: bool,
    },
    /// A number or `true`/`false`/`null`.
    Scalar,
}

/// A value passed over whole (depth 0: none). Only its own kind of bracket is
/// counted: in JSON, the `]` that ends an array is the first one outside strings at
/// which as many `]` as `[` were seen, whatever objects it holds.
#[derive(Debug)]
struct Skip {
    depth: usize,
    /// `[` or `{`.
    open: u8,
    in_str: bool,
    escaped: bool,
}

/// Which bytes end a run of bytes that do not matter.
type Stops = [bool; 256];

const fn stops(bytes: &[u8]) -> Stops {
    let mut t = [false; 256];
    let mut i = 0;
    while i < bytes.len() {
        t[bytes[i] as usize] = true;
        i += 1;
    }
    t
}

/// In a string: its closing quote, or an escape.
const IN_STRING: Stops = stops(b"\"\\");
/// JSON's white space.
const SPACE: Stops = stops(b" \n\r\t");

// Most of the answer is read 8 bytes at a time, as one `u64` (SWAR): white space,
// string contents, and the values passed over. `#![forbid(unsafe_code)]` leaves out
// the processor's vector instructions; this reads the answer about twice as fast as a
// byte at a time.

/// The low 7 bits of every byte.
const LOW7: u64 = 0x7F7F_7F7F_7F7F_7F7F;

/// The word of the 8 bytes of `buf` from `i`, the first lowest, if there are 8.
fn word(buf: &[u8], i: usize) -> Option<u64> {
    let bytes: [u8; 8] = buf.get(i..i + 8)?.try_into().ok()?;
    Some(u64::from_le_bytes(bytes))
}

/// The high bit of each byte of `w` that equals `c`, and no other bit. Exact: no
/// carry crosses from one byte into the next.
fn eq_bytes(w: u64, c: u8) -> u64 {
    let x = w ^ (u64::from(c) * LOW_BITS);
    !((x & LOW7).wrapping_add(LOW7) | x | LOW7)
}

/// The index of the first byte flagged in `m` (by its high bit).
fn first(m: u64) -> usize {
    (m.trailing_zeros() / 8) as usize
}

/// The low bit of every byte.
const LOW_BITS: u64 = 0x0101_0101_0101_0101;

/// The first index from `i` on whose byte is one of `stops`, or `buf.len()`.
fn next_stop(buf: &[u8], mut i: usize, stops: &Stops) -> usize {
    while i < buf.len() && !stops[buf[i] as usize] {
        i += 1;
    }
    i
}

/// The first index from `i` on whose byte is not white space, or `buf.len()`.
fn skip_space(buf: &[u8], mut i: usize) -> usize {
    while let Some(w) = word(buf, i) {
        // Envoy indents with spaces and ends lines with `\n`; `\r` and `\t` stop the
        // word and are passed a byte at a time.
        let other = !(eq_bytes(w, b' ') | eq_bytes(w, b'\n')) & !LOW7;
        if other != 0 {
            i += first(other);
            break;
        }
        i += 8;
    }
    while i < buf.len() && SPACE[buf[i] as usize] {
        i += 1;
    }
    i
}

/// The host being read.
#[derive(Debug, Default)]
struct HostAcc {
    socket: bool,
    ip: String,
    port: u64,
    pipe: Option<String>,
    /// A failed health flag is set.
    flagged: bool,
    /// `eds_health_status` is there and not `HEALTHY`.
    eds_unhealthy: bool,
}

impl HostAcc {
    /// Ready for the next host; the address's buffer is kept.
    fn reset(&mut self) {
        self.socket = false;
        self.ip.clear();
        self.port = 0;
        self.pipe = None;
        self.flagged = false;
        self.eds_unhealthy = false;
    }

    /// The address as `/clusters` text output writes it: `ip:port`, `[ip6]:port`,
    /// `unix://path`, or `-` for any other kind.
    fn address(&self) -> String {
        match (&self.socket, &self.pipe) {
            (true, _) => {
                let mut a = String::with_capacity(self.ip.len() + 8);
                let v6 = self.ip.contains(':');
                if v6 {
                    a.push('[');
                }
                a.push_str(&self.ip);
                if v6 {
                    a.push(']');
                }
                a.push(':');
                push_decimal(&mut a, self.port);
                a
            }
            (false, Some(path)) => format!("unix://{path}"),
            (false, None) => String::from("-"),
        }
    }

    /// Healthy as Envoy's text output says `healthy`: no failed flag, and no EDS
    /// status other than `HEALTHY`.
    fn healthy(&self) -> bool {
        !self.flagged && !self.eds_unhealthy
    }
}

/// Appends `n` in decimal (without the formatting machinery: once per host).
fn push_decimal(out: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for &d in &digits[at..] {
        out.push(char::from(d));
    }
}

/// The cluster being read.
#[derive(Debug, Default)]
struct ClusterAcc {
    name: Option<String>,
    added_via_api: bool,
    /// Each host's address and whether it is healthy.
    hosts: Vec<(String, bool)>,
}

/// Reads a `/clusters?format=json` answer fed in chunks ([`ClustersReader::feed`])
/// into the clusters a report carries ([`ClustersReader::finish`]).
#[derive(Debug)]
pub struct ClustersReader {
    /// The open containers along the kept path, innermost last. Any other container
    /// is passed over by `skip` and never pushed, so this is at most 8 deep.
    stack: Vec<Ctx>,
    /// Whether each of `stack` is an object (else an array).
    objects: Vec<bool>,
    expect: Expect,
    field: Field,
    skip: Skip,
    partial: Partial,
    carry: Vec<u8>,
    host: HostAcc,
    cluster: ClusterAcc,
    hosts_read: usize,
    /// Bytes of names and addresses kept so far.
    text_kept: usize,
    out: Vec<ReportedCluster>,
}

impl Default for ClustersReader {
    fn default() -> Self {
        Self::new()
    }
}

fn parse_error(what: impl std::fmt::Display) -> EnvoyError {
    EnvoyError::Parse(format!("/clusters?format=json: {what}"))
}

/// Where a number or literal starting in `buf` ends (its first byte that cannot
/// belong to it), if within `buf`.
fn scalar_end(buf: &[u8]) -> Option<usize> {
    buf.iter()
        .position(|&b| !(b.is_ascii_alphanumeric() || matches!(b, b'-' | b'+' | b'.')))
}

/// The index of the quote that closes a string whose content starts at `buf[0]`,
/// `escaped` telling whether the byte before was an escaping backslash; else
/// whether the last byte of `buf` escapes the next one.
fn string_end(buf: &[u8], escaped: bool) -> Result<usize, bool> {
    let mut i = 0;
    if escaped {
        if buf.is_empty() {
            return Err(true);
        }
        i = 1;
    }
    loop {
        while let Some(w) = word(buf, i) {
            let stops = eq_bytes(w, b'"') | eq_bytes(w, b'\\');
            if stops != 0 {
                i += first(stops);
                break;
            }
            i += 8;
        }
        i = next_stop(buf, i, &IN_STRING);
        match buf.get(i) {
            Some(b'"') => return Ok(i),
            // An escape: the next byte is taken whatever it is.
            Some(_) if i + 1 == buf.len() => return Err(true),
            Some(_) => i += 2,
            None => return Err(false),
        }
    }
}

/// The high bit of each byte of `w` below 0x20 or past ASCII: adding 0x60 to a
/// byte's low 7 bits sets its high bit exactly from 0x20 on, with no carry out of
/// the byte.
fn control_or_high(w: u64) -> u64 {
    let from_space = (w & LOW7).wrapping_add(0x6060_6060_6060_6060);
    (!from_space | w) & !LOW7
}

/// The text of a whole string token (quotes included).
fn string_text(token: &[u8]) -> Result<Cow<'_, str>, EnvoyError> {
    let raw = &token[1..token.len() - 1];
    if raw.contains(&b'\\') {
        serde_json::from_slice::<String>(token)
            .map(Cow::Owned)
            .map_err(parse_error)
    } else {
        std::str::from_utf8(raw)
            .map(Cow::Borrowed)
            .map_err(|_| parse_error("a string is not UTF-8"))
    }
}

/// Passes over whole words of `buf` from `i` while none holds a backslash: `Ok` just
/// past the value's end, or `Err` where the words stopped.
fn skip_words(s: &mut Skip, buf: &[u8], mut i: usize) -> Result<usize, usize> {
    // `[` and `]` (or `{` and `}`) are the bytes that, with 0x06 set, read 0x5F (or
    // 0x7F): with them `Y`, `Z`, `\\`, `^`, `_` (`y`, `z`, `|`, `~`, DEL), which JSON
    // has outside strings nowhere, and which are told apart below.
    let brackets = s.open | 0x06;
    while let Some(w) = word(buf, i) {
        if eq_bytes(w, b'\\') != 0 {
            return Err(i);
        }
        // The low bit of byte k set: byte k is inside a string (its opening quote
        // included). The product sums the quotes of bytes 0 to k into byte k (at most
        // 8: no carry), whose parity says it; flipped when the word starts inside one.
        let quotes = eq_bytes(w, b'"') >> 7;
        let mut inside = quotes.wrapping_mul(LOW_BITS) & LOW_BITS;
        if s.in_str {
            inside ^= LOW_BITS;
        }
        let mut hits = (eq_bytes(w | 0x0606_0606_0606_0606, brackets) >> 7) & !inside;
        while hits != 0 {
            let k = first(hits << 7);
            hits &= hits - 1;
            let b = buf[i + k];
            if b == s.open {
                s.depth += 1;
            } else if b == s.open + 2 {
                s.depth -= 1;
                if s.depth == 0 {
                    s.in_str = false;
                    return Ok(i + k + 1);
                }
            }
        }
        s.in_str = inside >> 56 != 0;
        i += 8;
    }
    Err(i)
}

/// Passes over the bytes of `buf` from `i`, one at a time: just past the value's end
/// when it ends there.
fn skip_bytes(s: &mut Skip, buf: &[u8], mut i: usize) -> Option<usize> {
    while i < buf.len() {
        let b = buf[i];
        i += 1;
        if s.escaped {
            s.escaped = false;
        } else if s.in_str {
            match b {
                b'\\' => s.escaped = true,
                b'"' => s.in_str = false,
                _ => {}
            }
        } else if b == b'"' {
            s.in_str = true;
        } else if b == s.open {
            s.depth += 1;
        } else if b == s.open + 2 {
            // `]` and `}` are two above `[` and `{`.
            s.depth -= 1;
            if s.depth == 0 {
                return Some(i);
            }
        }
    }
    None
}

impl ClustersReader {
    pub fn new() -> Self {
        ClustersReader {
            stack: Vec::with_capacity(8),
            objects: Vec::with_capacity(8),
            expect: Expect::Value,
            field: Field::Other,
            skip: Skip {
                depth: 0,
                open: b'[',
                in_str: false,
                escaped: false,
            },
            partial: Partial::None,
            carry: Vec::new(),
            host: HostAcc::default(),
            cluster: ClusterAcc::default(),
            hosts_read: 0,
            text_kept: 0,
            out: Vec::new(),
        }
    }

    /// Reads the next bytes of the answer.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<(), EnvoyError> {
        let mut rest = chunk;
        match self.partial {
            Partial::None => {}
            Partial::Str { escaped } => match string_end(rest, escaped) {
                Ok(end) => {
                    self.carry.extend_from_slice(&rest[..=end]);
                    rest = &rest[end + 1..];
                    self.partial = Partial::None;
                    let token = std::mem::take(&mut self.carry);
                    self.string(&token)?;
                    self.carry = token;
                    self.carry.clear();
                }
                Err(escaped) => {
                    self.partial = Partial::Str { escaped };
                    return self.keep(rest);
                }
            },
            Partial::Scalar => match scalar_end(rest) {
                Some(end) => {
                    self.carry.extend_from_slice(&rest[..end]);
                    rest = &rest[end..];
                    self.partial = Partial::None;
                    let token = std::mem::take(&mut self.carry);
                    self.scalar(&token)?;
                    self.carry = token;
                    self.carry.clear();
                }
                None => return self.keep(rest),
            },
        }
        self.run(rest)
    }

    /// The clusters read, sorted by name, once the whole answer was fed.
    pub fn finish(mut self) -> Result<Vec<ReportedCluster>, EnvoyError> {
        if self.partial == Partial::Scalar {
            // A number or literal ends with the answer.
            let token = std::mem::take(&mut self.carry);
            self.partial = Partial::None;
            self.scalar(&token)?;
        }
        if self.expect != Expect::Done || self.partial != Partial::None {
            return Err(parse_error("the answer ended early"));
        }
        self.out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(self.out)
    }

    /// Keeps the start of a cut token.
    fn keep(&mut self, bytes: &[u8]) -> Result<(), EnvoyError> {
        if self.carry.len() + bytes.len() > MAX_TOKEN {
            return Err(parse_error(format!(
                "a string or number is over {MAX_TOKEN} bytes"
            )));
        }
        self.carry.extend_from_slice(bytes);
        Ok(())
    }

    fn run(&mut self, buf: &[u8]) -> Result<(), EnvoyError> {
        let mut i = 0;
        while i < buf.len() {
            if self.skip.depth > 0 {
                i = self.skip_over(buf, i);
                if self.skip.depth == 0 {
                    self.value_done();
                }
                continue;
            }
            let b = buf[i];
            match b {
                _ if SPACE[b as usize] => i = skip_space(buf, i + 1),
                b'"' => match string_end(&buf[i + 1..], false) {
                    Ok(len) => {
                        let end = i + 1 + len;
                        self.string(&buf[i..=end])?;
                        i = end + 1;
                    }
                    Err(escaped) => {
                        self.partial = Partial::Str { escaped };
                        return self.keep(&buf[i..]);
                    }
                },
                b'{' | b'[' => {
                    self.open(b == b'{')?;
                    i += 1;
                }
                b'}' | b']' => {
                    self.close(b == b'}')?;
                    i += 1;
                }
                b':' => {
                    if self.expect != Expect::Colon {
                        return Err(parse_error("a misplaced `:`"));
                    }
                    self.expect = Expect::Value;
                    i += 1;
                }
                b',' => {
                    if self.expect != Expect::CommaOrEnd {
                        return Err(parse_error("a misplaced `,`"));
                    }
                    if self.objects.last() == Some(&true) {
                        self.expect = Expect::Key;
                    } else {
                        self.expect = Expect::Value;
                        self.field = Field::Element;
                    }
                    i += 1;
                }
                _ => match scalar_end(&buf[i..]) {
                    Some(0) => return Err(parse_error(format!("unexpected byte {b:#04x}"))),
                    Some(len) => {
                        self.scalar(&buf[i..i + len])?;
                        i += len;
                    }
                    None => {
                        self.partial = Partial::Scalar;
                        return self.keep(&buf[i..]);
                    }
                },
            }
        }
        Ok(())
    }

    /// Passes over a value from `buf[i]` on; answers where it stopped (the end of
    /// `buf`, or just past the value's last bracket, `skip.depth` then 0).
    fn skip_over(&mut self, buf: &[u8], mut i: usize) -> usize {
        loop {
            if !self.skip.escaped {
                match skip_words(&mut self.skip, buf, i) {
                    Ok(end) => return end,
                    Err(at) => i = at,
                }
            }
            // What words do not take (a word with an escape, the last bytes): a byte
            // at a time, up to the next word.
            let stop = (i + 8).min(buf.len());
            match skip_bytes(&mut self.skip, &buf[..stop], i) {
                Some(end) => return end,
                None if stop == buf.len() => return stop,
                None => i = stop,
            }
        }
    }

    fn expecting_value(&self) -> bool {
        matches!(self.expect, Expect::Value | Expect::ValueOrEnd)
    }

    /// A value ended: its container's `,` or end comes next.
    fn value_done(&mut self) {
        self.expect = if self.stack.is_empty() {
            Expect::Done
        } else {
            Expect::CommaOrEnd
        };
    }

    fn open(&mut self, object: bool) -> Result<(), EnvoyError> {
        if !self.expecting_value() {
            return Err(parse_error("a misplaced `{` or `[`"));
        }
        let child = match (self.stack.last(), self.field, object) {
            (None, _, true) => Some(Ctx::Root),
            (None, _, false) => return Err(parse_error("the answer is not an object")),
            (Some(Ctx::Root), Field::ClusterStatuses, false) => Some(Ctx::Clusters),
            (Some(Ctx::Clusters), Field::Element, true) => {
                if self.out.len() >= MAX_READ_CLUSTERS {
                    return Err(parse_error(format!(
                        "the sidecar lists over {MAX_READ_CLUSTERS} clusters"
                    )));
                }
                self.cluster.name = None;
                self.cluster.added_via_api = false;
                self.cluster.hosts.clear();
                Some(Ctx::Cluster)
            }
            (Some(Ctx::Cluster), Field::HostStatuses, false) => Some(Ctx::Hosts),
            (Some(Ctx::Hosts), Field::Element, true) => {
                self.hosts_read += 1;
                if self.hosts_read > MAX_READ_HOSTS {
                    return Err(parse_error(format!(
                        "the sidecar lists over {MAX_READ_HOSTS} hosts"
                    )));
                }
                self.host.reset();
                Some(Ctx::Host)
            }
            (Some(Ctx::Host), Field::Address, true) => {
                // A host lists one address: a repeated key replaces it.
                self.host.socket = false;
                self.host.pipe = None;
                Some(Ctx::Address)
            }
            (Some(Ctx::Address), Field::SocketAddress, true) => {
                self.host.socket = true;
                Some(Ctx::Socket)
            }
            (Some(Ctx::Address), Field::Pipe, true) => {
                self.host.pipe = Some(String::new());
                Some(Ctx::Pipe)
            }
            (Some(Ctx::Host), Field::HealthStatus, true) => Some(Ctx::Health),
            _ => None,
        };
        match child {
            Some(ctx) => {
                self.stack.push(ctx);
                self.objects.push(object);
                if object {
                    self.expect = Expect::KeyOrEnd;
                } else {
                    self.expect = Expect::ValueOrEnd;
                    self.field = Field::Element;
                }
            }
            None => {
                self.skip = Skip {
                    depth: 1,
                    open: if object { b'{' } else { b'[' },
                    in_str: false,
                    escaped: false,
                };
            }
        }
        Ok(())
    }

    fn close(&mut self, object: bool) -> Result<(), EnvoyError> {
        let allowed = match self.expect {
            Expect::CommaOrEnd => true,
            Expect::KeyOrEnd => object,
            Expect::ValueOrEnd => !object,
            _ => false,
        };
        if !allowed || self.objects.last() != Some(&object) {
            return Err(parse_error("a misplaced `}` or `]`"));
        }
        self.objects.pop();
        match self.stack.pop() {
            Some(Ctx::Host) => {
                let address = self.host.address();
                self.keep_text(address.len())?;
                let healthy = self.host.healthy();
                self.cluster.hosts.push((address, healthy));
            }
            Some(Ctx::Cluster) => {
                let cluster = reported(&mut self.cluster)?;
                self.keep_text(cluster.name.len())?;
                self.out.push(cluster);
            }
            _ => {}
        }
        self.value_done();
        Ok(())
    }

    /// Counts `len` more bytes of kept text against [`MAX_READ_TEXT`].
    fn keep_text(&mut self, len: usize) -> Result<(), EnvoyError> {
        self.text_kept += len;
        if self.text_kept > MAX_READ_TEXT {
            return Err(parse_error(format!(
                "the sidecar's cluster names and addresses are over {MAX_READ_TEXT} bytes"
            )));
        }
        Ok(())
    }

    /// A whole string token, quotes included: a key or a value.
    fn string(&mut self, token: &[u8]) -> Result<(), EnvoyError> {
        if token.len() > MAX_TOKEN {
            return Err(parse_error(format!(
                "a string or number is over {MAX_TOKEN} bytes"
            )));
        }
        check_string(token)?;
        match self.expect {
            Expect::Key | Expect::KeyOrEnd => {
                let ctx = *self
                    .stack
                    .last()
                    .ok_or_else(|| parse_error("a key outside an object"))?;
                let raw = &token[1..token.len() - 1];
                self.field = if raw.contains(&b'\\') {
                    key_field(ctx, string_text(token)?.as_bytes())
                } else {
                    key_field(ctx, raw)
                };
                self.expect = Expect::Colon;
                Ok(())
            }
            Expect::Value | Expect::ValueOrEnd => {
                match (self.stack.last(), self.field) {
                    (Some(Ctx::Cluster), Field::Name) => {
                        self.cluster.name = Some(string_text(token)?.into_owned());
                    }
                    (Some(Ctx::Socket), Field::Ip) => {
                        self.host.ip.clear();
                        self.host.ip.push_str(&string_text(token)?);
                    }
                    (Some(Ctx::Pipe), Field::Path) => {
                        self.host.pipe = Some(string_text(token)?.into_owned());
                    }
                    (Some(Ctx::Health), Field::EdsHealth) => {
                        self.host.eds_unhealthy =
                            token != b"\"HEALTHY\"" && string_text(token)? != "HEALTHY";
                    }
                    _ => {}
                }
                self.value_done();
                Ok(())
            }
            _ => Err(parse_error("a misplaced string")),
        }
    }

    /// A whole number or literal.
    fn scalar(&mut self, token: &[u8]) -> Result<(), EnvoyError> {
        if !self.expecting_value() {
            return Err(parse_error("a misplaced value"));
        }
        let literal = match token {
            b"true" => Some(true),
            b"false" => Some(false),
            b"null" => None,
            _ if is_number(token) => None,
            _ => return Err(parse_error("a value that is not JSON")),
        };
        match (self.stack.last(), self.field, literal) {
            (Some(Ctx::Cluster), Field::AddedViaApi, Some(v)) => self.cluster.added_via_api = v,
            (Some(Ctx::Health), Field::HealthFlag, Some(true)) => self.host.flagged = true,
            (Some(Ctx::Socket), Field::Port, None) if token != b"null" => {
                self.host.port = std::str::from_utf8(token)
                    .ok()
                    .and_then(|t| t.parse().ok())
                    .ok_or_else(|| parse_error("a port that is not a whole number"))?;
            }
            _ => {}
        }
        self.value_done();
        Ok(())
    }
}

/// Whether `token` is a JSON number: `-`? then `0` or a digit 1 to 9 and digits,
/// then `.` and digits, then `e` or `E`, a sign and digits, the last two optional.
fn is_number(token: &[u8]) -> bool {
    let digits = |t: &[u8], at: usize| t[at..].iter().take_while(|b| b.is_ascii_digit()).count();
    let mut i = usize::from(token.first() == Some(&b'-'));
    match token.get(i) {
        Some(b'0') => i += 1,
        Some(b'1'..=b'9') => i += digits(token, i),
        _ => return false,
    }
    if token.get(i) == Some(&b'.') {
        let n = digits(token, i + 1);
        if n == 0 {
            return false;
        }
        i += 1 + n;
    }
    if matches!(token.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(token.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        let n = digits(token, i);
        if n == 0 {
            return false;
        }
        i += n;
    }
    i == token.len()
}

/// Checks a string token the reader reads (a key, or a value of an object or array
/// it follows): UTF-8 without raw control characters, its escapes valid. Every
/// one the reader reads is checked, kept or not, so a fault where it reads is an
/// error; the values it passes over are not.
fn check_string(token: &[u8]) -> Result<(), EnvoyError> {
    let raw = &token[1..token.len() - 1];
    if plain_ascii(raw) {
        return Ok(());
    }
    if raw.contains(&b'\\') {
        // Decoded, not passed over: passing over leaves a lone surrogate half unseen.
        return serde_json::from_slice::<String>(token)
            .map(drop)
            .map_err(parse_error);
    }
    if raw.iter().any(|&b| b < 0x20) {
        return Err(parse_error("a string holds a control character"));
    }
    if !raw.is_ascii() && std::str::from_utf8(raw).is_err() {
        return Err(parse_error("a string is not UTF-8"));
    }
    Ok(())
}

/// Whether `raw` is printable ASCII without a backslash: the string is valid as it
/// stands. Read 8 bytes at a time, the last word overlapping the one before (or
/// padded, for a string under 8 bytes).
fn plain_ascii(raw: &[u8]) -> bool {
    let special = |w: u64| eq_bytes(w, b'\\') | control_or_high(w);
    let mut found = 0;
    let mut i = 0;
    while let Some(w) = word(raw, i) {
        found |= special(w);
        i += 8;
    }
    if i < raw.len() {
        let last = match raw.len().checked_sub(8).and_then(|at| word(raw, at)) {
            Some(w) => w,
            None => {
                let mut padded = [b'a'; 8];
                padded[..raw.len()].copy_from_slice(raw);
                u64::from_le_bytes(padded)
            }
        };
        found |= special(last);
    }
    found == 0
}

/// What the value of `key` (its text, unescaped) in an object of `ctx` is.
fn key_field(ctx: Ctx, key: &[u8]) -> Field {
    match (ctx, key) {
        (Ctx::Root, b"cluster_statuses") => Field::ClusterStatuses,
        (Ctx::Cluster, b"name") => Field::Name,
        (Ctx::Cluster, b"added_via_api") => Field::AddedViaApi,
        (Ctx::Cluster, b"host_statuses") => Field::HostStatuses,
        (Ctx::Host, b"address") => Field::Address,
        (Ctx::Host, b"health_status") => Field::HealthStatus,
        (Ctx::Address, b"socket_address") => Field::SocketAddress,
        (Ctx::Address, b"pipe") => Field::Pipe,
        (Ctx::Socket, b"address") => Field::Ip,
        (Ctx::Socket, b"port_value") => Field::Port,
        (Ctx::Pipe, b"path") => Field::Path,
        (Ctx::Health, b"eds_health_status") => Field::EdsHealth,
        (Ctx::Health, _) => Field::HealthFlag,
        _ => Field::Other,
    }
}

/// A read cluster as the wire reports it. A host listed more than once (the same
/// address in two priorities) is one address, healthy when any of its entries is.
/// Leaves `cluster` empty for the next one, its buffer kept.
fn reported(cluster: &mut ClusterAcc) -> Result<ReportedCluster, EnvoyError> {
    let name = cluster
        .name
        .take()
        .ok_or_else(|| parse_error("a cluster has no name"))?;
    let added_via_api = std::mem::take(&mut cluster.added_via_api);
    cluster.hosts.sort_unstable();
    // Sorted by (address, healthy): of one address's entries the healthy one is last.
    let mut addresses: Vec<String> = Vec::with_capacity(cluster.hosts.len());
    let mut healthy = 0u32;
    let mut hosts = cluster.hosts.drain(..).peekable();
    while let Some((address, ok)) = hosts.next() {
        if hosts.peek().is_some_and(|(next, _)| *next == address) {
            continue;
        }
        healthy += u32::from(ok);
        addresses.push(address);
    }
    drop(hosts);
    Ok(ReportedCluster {
        name,
        added_via_api,
        hosts_digest: hosts_digest(addresses.iter().map(String::as_str)),
        host_count: u32::try_from(addresses.len()).unwrap_or(u32::MAX),
        healthy_count: healthy,
        hosts: addresses,
    })
}

/// Reads a whole `/clusters?format=json` answer at once.
pub fn read_clusters(answer: &[u8]) -> Result<Vec<ReportedCluster>, EnvoyError> {
    let mut reader = ClustersReader::new();
    reader.feed(answer)?;
    reader.finish()
}

#[cfg(test)]
mod differential;

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> Vec<u8> {
        let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    fn find<'a>(clusters: &'a [ReportedCluster], name: &str) -> &'a ReportedCluster {
        clusters
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("{name} in {clusters:?}"))
    }

    /// The same clusters read from Envoy's text form of the same moment
    /// (`cluster::address::health_flags::flags` and `cluster::added_via_api::bool`
    /// lines): what Envoy itself calls healthy.
    fn from_text(text: &str) -> Vec<ReportedCluster> {
        let mut clusters: std::collections::BTreeMap<String, (bool, Vec<(String, bool)>)> =
            Default::default();
        for line in text.lines() {
            if let Some((name, via)) = line.rsplit_once("::added_via_api::") {
                clusters.entry(name.to_owned()).or_default().0 = via == "true";
            } else if let Some((head, flags)) = line.rsplit_once("::health_flags::") {
                // The address is what follows the cluster's name and `::`.
                let name = clusters
                    .keys()
                    .find(|n| head.starts_with(&format!("{n}::")))
                    .cloned()
                    .expect("a cluster's lines start with added_via_api");
                let address = head[name.len() + 2..].to_owned();
                let address = match address.strip_prefix('/') {
                    Some(_) => format!("unix://{address}"),
                    None => address,
                };
                let entry = clusters.get_mut(&name).unwrap();
                entry.1.push((address, flags == "healthy"));
            }
        }
        clusters
            .into_iter()
            .map(|(name, (added_via_api, hosts))| {
                reported(&mut ClusterAcc {
                    name: Some(name),
                    added_via_api,
                    hosts,
                })
                .unwrap()
            })
            .collect()
    }

    /// A real answer with every kind of host: healthy, failed by EDS status
    /// (unhealthy, draining, degraded, timeout), failed by an active health check,
    /// one address listed in two priorities, IPv6, a pipe, a cluster from CDS, a name
    /// with escapes, a cluster without endpoints, and localities and a host name
    /// full of brackets, quotes and escapes in the values passed over.
    #[test]
    fn a_real_answer_reads_as_envoy_counts_it() {
        let clusters = read_clusters(&fixture("clusters_health_flags.json")).unwrap();
        let names: Vec<&str> = clusters.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "checked",
                "from_cds",
                "ipv6",
                "mixed_health",
                "no_endpoints",
                "odd \"name\" é\\x",
                "odd_localities",
                "pipe"
            ]
        );
        let mixed = find(&clusters, "mixed_health");
        assert_eq!(
            mixed.hosts,
            [
                "10.1.0.1:8080",
                "10.1.0.2:8080",
                "10.1.0.3:8080",
                "10.1.0.4:8080",
                "10.1.0.5:8080",
                "10.1.1.1:9090"
            ]
        );
        assert_eq!((mixed.host_count, mixed.healthy_count), (6, 2));
        assert!(!mixed.added_via_api);
        let checked = find(&clusters, "checked");
        assert_eq!((checked.host_count, checked.healthy_count), (2, 1));
        assert!(find(&clusters, "from_cds").added_via_api);
        assert_eq!(
            find(&clusters, "ipv6").hosts,
            ["[::1]:8080", "[fd00::2]:80"]
        );
        assert_eq!(
            find(&clusters, "pipe").hosts,
            ["unix:///tmp/meshcat-fixture.sock"]
        );
        let odd = find(&clusters, "odd_localities");
        assert_eq!(odd.hosts, ["10.4.0.1:81", "10.4.0.2:82", "10.4.0.3:83"]);
        assert_eq!((odd.host_count, odd.healthy_count), (3, 2));
        let empty = find(&clusters, "no_endpoints");
        assert_eq!((empty.host_count, empty.hosts_digest), (0, 0));
        for c in &clusters {
            assert!(c.has_addresses(), "{c:?}");
            assert_eq!(
                c.hosts_digest,
                hosts_digest(c.hosts.iter().map(String::as_str))
            );
        }
        // Envoy's own text form of the same moment agrees on every host and health.
        let text = String::from_utf8(fixture("clusters_health_flags.txt")).unwrap();
        assert_eq!(clusters, from_text(&text));
    }

    #[test]
    fn the_older_fixture_reads_too() {
        let clusters = read_clusters(&fixture("clusters_one_host_and_no_endpoints.json")).unwrap();
        assert_eq!(clusters.len(), 2);
        assert_eq!(clusters[0].name, "local_service");
        assert_eq!(clusters[0].hosts, ["127.0.0.1:34257"]);
        assert_eq!((clusters[0].host_count, clusters[0].healthy_count), (1, 1));
        assert_eq!(clusters[1].name, "no_endpoints");
        assert!(clusters[1].hosts.is_empty());
    }

    /// However the answer is cut into chunks, the same clusters come out.
    #[test]
    fn any_cut_into_chunks_reads_the_same() {
        let answer = fixture("clusters_health_flags.json");
        let whole = read_clusters(&answer).unwrap();
        for size in [1, 2, 3, 7, 64, 1000] {
            let mut reader = ClustersReader::new();
            for chunk in answer.chunks(size) {
                reader.feed(chunk).unwrap();
            }
            assert_eq!(reader.finish().unwrap(), whole, "chunks of {size}");
        }
        for cut in 0..answer.len() {
            let mut reader = ClustersReader::new();
            reader.feed(&answer[..cut]).unwrap();
            reader.feed(&answer[cut..]).unwrap();
            assert_eq!(reader.finish().unwrap(), whole, "cut at {cut}");
        }
    }

    /// The reader keeps what a full parse keeps: the answer without its white space,
    /// and the same answer compact, read alike.
    #[test]
    fn white_space_does_not_matter() {
        let answer = fixture("clusters_health_flags.json");
        let value: serde_json::Value = serde_json::from_slice(&answer).unwrap();
        let compact = serde_json::to_vec(&value).unwrap();
        assert_eq!(
            read_clusters(&compact).unwrap(),
            read_clusters(&answer).unwrap()
        );
    }

    #[test]
    fn a_cut_or_broken_answer_is_an_error_not_a_list() {
        let answer = fixture("clusters_health_flags.json");
        for cut in [1, answer.len() / 2, answer.len() - 2] {
            assert!(read_clusters(&answer[..cut]).is_err(), "cut at {cut}");
        }
        for bad in [
            &b"[]"[..],
            b"{\"cluster_statuses\": [}",
            b"{\"cluster_statuses\": [{\"host_statuses\": []}]}",
            b"{\"cluster_statuses\": [{\"name\": \"a\",}]}",
            b"{\"cluster_statuses\": [{\"name\": tru}]}",
            b"{} {}",
            // Found by the differential tests: a number JSON does not have, and a
            // string with an invalid escape, a lone surrogate half or a raw control
            // character, where the reader reads, were taken.
            b"{\"a\": 01}",
            b"{\"cluster_statuses\": [{\"name\": \"a\", \"weight\": 1.}]}",
            b"{\"cluster_statuses\": [{\"name\": \"a\", \"priority\": -}]}",
            b"{\"a\": \"\\x\"}",
            b"{\"cluster_statuses\": [{\"name\": \"\\ud800\"}]}",
            b"{\"cluster_statuses\": [{\"name\": \"a\x01\"}]}",
        ] {
            assert!(
                read_clusters(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        // No clusters at all is an empty list.
        assert!(read_clusters(b"{}").unwrap().is_empty());
    }

    /// The word-at-a-time test of a plain string agrees with the byte-wise one for
    /// every byte at every place of strings of every length up to three words.
    #[test]
    fn plain_strings_are_told_word_by_word() {
        let plain = |s: &[u8]| s.iter().all(|&b| (0x20..0x80).contains(&b) && b != b'\\');
        for len in 1..=24 {
            for at in 0..len {
                for b in 0..=255u8 {
                    let mut s = vec![b'a'; len];
                    s[at] = b;
                    assert_eq!(plain_ascii(&s), plain(&s), "{b:#04x} at {at} of {len}");
                }
            }
        }
        assert!(plain_ascii(b""));
    }

    #[test]
    fn an_answer_over_the_bounds_is_refused() {
        let host =
            "{\"address\":{\"socket_address\":{\"address\":\"10.0.0.1\",\"port_value\":80}}}";
        let mut reader = ClustersReader::new();
        reader
            .feed(b"{\"cluster_statuses\":[{\"name\":\"big\",\"host_statuses\":[")
            .unwrap();
        let mut refused = None;
        for i in 0..=MAX_READ_HOSTS {
            let sep: &[u8] = if i == 0 { b"" } else { b"," };
            if let Err(e) = reader.feed(sep).and_then(|()| reader.feed(host.as_bytes())) {
                refused = Some((i, e));
                break;
            }
        }
        let (at, e) = refused.expect("refused");
        assert_eq!(at, MAX_READ_HOSTS);
        assert!(e.to_string().contains("hosts"), "{e}");
        let long = format!(
            "{{\"cluster_statuses\":[{{\"name\":\"{}\"}}]}}",
            "a".repeat(MAX_TOKEN)
        );
        assert!(read_clusters(long.as_bytes()).is_err());
        // Long names, each within the token bound, are kept up to MAX_READ_TEXT bytes.
        let name = "n".repeat(MAX_TOKEN / 2);
        let mut reader = ClustersReader::new();
        reader.feed(b"{\"cluster_statuses\":[").unwrap();
        let mut kept = 0;
        let refused = loop {
            let sep = if kept == 0 { "" } else { "," };
            let cluster = format!("{sep}{{\"name\":\"{name}\"}}");
            match reader.feed(cluster.as_bytes()) {
                Ok(()) => kept += 1,
                Err(e) => break e,
            }
        };
        assert_eq!(kept, MAX_READ_TEXT / name.len());
        assert!(
            refused.to_string().contains("names and addresses"),
            "{refused}"
        );
    }
}
