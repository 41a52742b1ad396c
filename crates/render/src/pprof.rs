//! pprof profiles (`profile.proto`, gzipped), which `go tool pprof`,
//! Pyroscope and others read: one sample per site, its frames from the
//! culprit outwards as locations with real function, file and line.
//!
//! The messages are declared here with prost's derive, field numbers as in
//! <https://github.com/google/pprof/blob/main/proto/profile.proto>: a build
//! step running `protoc` for five small messages would cost every build more
//! than it saves.

use std::io::Write;

use prost::Message;
use rustc_hash::FxHashMap;
use snapdiff_analyze::Site;

use crate::flamegraph::Drawn;

#[derive(Clone, PartialEq, Message)]
struct Profile {
    #[prost(message, repeated, tag = "1")]
    sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    sample: Vec<Sample>,
    #[prost(message, repeated, tag = "4")]
    location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    string_table: Vec<String>,
    #[prost(int64, tag = "9")]
    time_nanos: i64,
    #[prost(int64, tag = "14")]
    default_sample_type: i64,
}

#[derive(Clone, PartialEq, Message)]
struct ValueType {
    #[prost(int64, tag = "1")]
    r#type: i64,
    #[prost(int64, tag = "2")]
    unit: i64,
}

#[derive(Clone, PartialEq, Message)]
struct Sample {
    /// Innermost first.
    #[prost(uint64, repeated, tag = "1")]
    location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    value: Vec<i64>,
}

#[derive(Clone, PartialEq, Message)]
struct Location {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(message, repeated, tag = "4")]
    line: Vec<Line>,
}

#[derive(Clone, PartialEq, Message)]
struct Line {
    #[prost(uint64, tag = "1")]
    function_id: u64,
    #[prost(int64, tag = "2")]
    line: i64,
}

#[derive(Clone, PartialEq, Message)]
struct Function {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(int64, tag = "2")]
    name: i64,
    #[prost(int64, tag = "3")]
    system_name: i64,
    #[prost(int64, tag = "4")]
    filename: i64,
}

/// Builds a profile's tables: strings, functions and locations, each once.
#[derive(Default)]
struct Builder {
    profile: Profile,
    strings: FxHashMap<String, i64>,
    functions: FxHashMap<(String, String), u64>,
    locations: FxHashMap<(String, String, u32), u64>,
}

impl Builder {
    fn new() -> Builder {
        let mut b = Builder::default();
        b.string(""); // index 0 is the empty string
        b
    }

    fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.profile.string_table.len() as i64;
        self.profile.string_table.push(s.to_owned());
        self.strings.insert(s.to_owned(), i);
        i
    }

    fn value_type(&mut self, kind: &str, unit: &str) -> ValueType {
        ValueType {
            r#type: self.string(kind),
            unit: self.string(unit),
        }
    }

    fn location(&mut self, name: &str, file: &str, line: u32) -> u64 {
        let key = (name.to_owned(), file.to_owned(), line);
        if let Some(&id) = self.locations.get(&key) {
            return id;
        }
        let function_key = (name.to_owned(), file.to_owned());
        let function_id = match self.functions.get(&function_key) {
            Some(&id) => id,
            None => {
                let id = self.profile.function.len() as u64 + 1;
                let shown = function_name(name, file);
                let (name, filename) = (self.string(&shown), self.string(file));
                self.profile.function.push(Function {
                    id,
                    name,
                    system_name: name,
                    filename,
                });
                self.functions.insert(function_key, id);
                id
            }
        };
        let id = self.profile.location.len() as u64 + 1;
        self.profile.location.push(Location {
            id,
            line: vec![Line {
                function_id,
                line: i64::from(line),
            }],
        });
        self.locations.insert(key, id);
        id
    }

    /// One sample of `site`, from its culprit outwards: the frames inside
    /// the culprit (allocator plumbing, library and native code) are left
    /// out, so that `pprof -top` puts each site's bytes on the line of the
    /// program that asked for them, as every report of snapdiff does.
    fn sample(&mut self, site: &Site, value: Vec<i64>) {
        let c = &site.culprit;
        let from = site
            .frames
            .iter()
            .position(|f| f.name == c.name && f.file == c.file && f.line == c.line)
            .unwrap_or(0);
        let frames = &site.frames[from..];
        let location_id = if frames.is_empty() {
            vec![self.location("(no stack recorded)", "", 0)]
        } else {
            frames
                .iter()
                .map(|f| self.location(&f.name, &f.file, f.line))
                .collect()
        };
        self.profile.sample.push(Sample { location_id, value });
    }
}

/// `name` as pprof shows it. pprof drops what is between `<` and `>` (C++
/// template arguments), so Python's `<module>` would read `<unknown>`: a
/// module's code is named by its file (`train.py`), and `<lambda>`,
/// `<listcomp>` and the like by what they are and their file.
fn function_name(name: &str, file: &str) -> String {
    let Some(inner) = name.strip_prefix('<').and_then(|n| n.strip_suffix('>')) else {
        return name.to_owned();
    };
    let base = file.rsplit(['/', '\\']).next().unwrap_or(file);
    match (inner, base) {
        (_, "" | "??") => inner.to_owned(),
        ("module", base) => base.to_owned(),
        (inner, base) => format!("{inner} in {base}"),
    }
}

/// Writes `drawn` as a gzipped pprof profile. One file gives the sample
/// types `inuse_space` (bytes) and `inuse_objects` (blocks); a difference
/// gives `growth_space` (bytes, negative where a site shrank) and the
/// `inuse_space` of the second file.
pub fn write(drawn: &Drawn, time_nanos: i64, out: &mut dyn Write) -> std::io::Result<()> {
    let mut b = Builder::new();
    b.profile.time_nanos = time_nanos;
    match drawn {
        Drawn::One(sites) => {
            b.profile.sample_type = vec![
                b.value_type("inuse_space", "bytes"),
                b.value_type("inuse_objects", "count"),
            ];
            for s in sites {
                b.sample(&s.site, vec![s.bytes as i64, s.blocks as i64]);
            }
        }
        Drawn::Diff(pairs) => {
            b.profile.sample_type = vec![
                b.value_type("growth_space", "bytes"),
                b.value_type("inuse_space", "bytes"),
            ];
            for (s, before, after) in pairs {
                b.sample(&s.site, vec![*after as i64 - *before as i64, *after as i64]);
            }
        }
    }
    b.profile.default_sample_type = b.profile.sample_type[0].r#type;
    let mut gz = flate2::write::GzEncoder::new(out, flate2::Compression::default());
    gz.write_all(&b.profile.encode_to_vec())?;
    gz.finish()?;
    Ok(())
}
