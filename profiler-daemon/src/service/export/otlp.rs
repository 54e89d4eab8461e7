//! OTLP profiles (the OpenTelemetry signal, still marked development): the same interval
//! profile as the Pyroscope push, re-encoded as an `ExportProfilesServiceRequest` (types from
//! `opentelemetry-proto`) for an OpenTelemetry Collector's OTLP/HTTP receiver.
//!
//! OTLP profiles keep one sample type per profile, so one pprof profile with three sample types
//! becomes three OTLP profiles (calls, wall, self) sharing one dictionary: the pprof string,
//! function, location and mapping tables carry over, each OTLP table starting with its zero
//! value as the format requires, and each pprof sample's stack becomes a stack-table entry.
use fdr_analysis::convert::pprof::proto as pprof;
use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::profiles::v1development as otlp;
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message as _;

/// OTLP/HTTP's path for profiles.
pub const PATH: &str = "/v1development/profiles";
/// The semantic-convention key of a GNU build-id.
const BUILD_ID_KEY: &str = "process.executable.build_id.gnu";

/// What the resource says: the target as `service.name`, the host, the process.
pub struct ResourceLabels<'a> {
    pub service_name: &'a str,
    pub host_name: &'a str,
    pub pid: u32,
    pub executable: &'a str,
    pub build_id: &'a str,
}

fn string(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.to_owned())),
        }),
        ..KeyValue::default()
    }
}

/// `profile`, re-encoded as an OTLP request body (protobuf).
pub fn request(profile: &pprof::Profile, resource: &ResourceLabels<'_>) -> Vec<u8> {
    let mut strings = profile.string_table.clone();
    if strings.is_empty() {
        strings.push(String::new());
    }
    let string_index = |s: &str, strings: &mut Vec<String>| -> i32 {
        match strings.iter().position(|t| t == s) {
            Some(i) => i as i32,
            None => {
                strings.push(s.to_owned());
                (strings.len() - 1) as i32
            }
        }
    };
    // pprof ids are 1-based and dense in the profiles written here: entry `id` of each table.
    let mut attribute_table = vec![otlp::KeyValueAndUnit::default()];
    let build_id_key = string_index(BUILD_ID_KEY, &mut strings);
    let mut mapping_table = vec![otlp::Mapping::default()];
    for m in &profile.mapping {
        let mut attribute_indices = Vec::new();
        let build_id = strings
            .get(m.build_id as usize)
            .cloned()
            .unwrap_or_default();
        if !build_id.is_empty() {
            attribute_table.push(otlp::KeyValueAndUnit {
                key_strindex: build_id_key,
                value: Some(AnyValue {
                    value: Some(any_value::Value::StringValue(build_id)),
                }),
                unit_strindex: 0,
            });
            attribute_indices.push((attribute_table.len() - 1) as i32);
        }
        mapping_table.push(otlp::Mapping {
            memory_start: m.memory_start,
            memory_limit: m.memory_limit,
            file_offset: m.file_offset,
            filename_strindex: m.filename as i32,
            attribute_indices,
        });
    }
    let mut function_table = vec![otlp::Function::default()];
    function_table.extend(profile.function.iter().map(|f| otlp::Function {
        name_strindex: f.name as i32,
        system_name_strindex: f.system_name as i32,
        filename_strindex: f.filename as i32,
        start_line: f.start_line,
    }));
    let mut location_table = vec![otlp::Location::default()];
    location_table.extend(profile.location.iter().map(|l| {
        otlp::Location {
            mapping_index: l.mapping_id as i32,
            address: l.address,
            lines: l
                .line
                .iter()
                .map(|line| otlp::Line {
                    function_index: line.function_id as i32,
                    line: line.line,
                    column: 0,
                })
                .collect(),
            attribute_indices: Vec::new(),
        }
    }));
    let mut stack_table = vec![otlp::Stack::default()];
    stack_table.extend(profile.sample.iter().map(|s| otlp::Stack {
        location_indices: s.location_id.iter().map(|&l| l as i32).collect(),
    }));
    let profiles = profile
        .sample_type
        .iter()
        .enumerate()
        .map(|(k, t)| otlp::Profile {
            sample_type: Some(otlp::ValueType {
                type_strindex: t.r#type as i32,
                unit_strindex: t.unit as i32,
            }),
            samples: profile
                .sample
                .iter()
                .enumerate()
                .filter(|(_, s)| s.value.get(k).is_some_and(|&v| v != 0))
                .map(|(i, s)| otlp::Sample {
                    stack_index: i as i32 + 1,
                    values: vec![s.value[k]],
                    ..otlp::Sample::default()
                })
                .collect(),
            time_unix_nano: profile.time_nanos.max(0) as u64,
            duration_nano: profile.duration_nanos.max(0) as u64,
            profile_id: profile_id(resource, profile.time_nanos, k),
            ..otlp::Profile::default()
        })
        .collect();
    let request = ExportProfilesServiceRequest {
        resource_profiles: vec![otlp::ResourceProfiles {
            resource: Some(Resource {
                attributes: vec![
                    string("service.name", resource.service_name),
                    string("host.name", resource.host_name),
                    KeyValue {
                        key: "process.pid".to_owned(),
                        value: Some(AnyValue {
                            value: Some(any_value::Value::IntValue(i64::from(resource.pid))),
                        }),
                        ..KeyValue::default()
                    },
                    string("process.executable.path", resource.executable),
                    string(BUILD_ID_KEY, resource.build_id),
                ],
                ..Resource::default()
            }),
            scope_profiles: vec![otlp::ScopeProfiles {
                scope: Some(InstrumentationScope {
                    name: "fdr-profiled".to_owned(),
                    version: env!("CARGO_PKG_VERSION").to_owned(),
                    ..InstrumentationScope::default()
                }),
                profiles,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
        dictionary: Some(otlp::ProfilesDictionary {
            mapping_table,
            location_table,
            function_table,
            link_table: vec![otlp::Link::default()],
            string_table: strings,
            attribute_table,
            stack_table,
        }),
    };
    request.encode_to_vec()
}

/// 16 bytes, never all zero (which OTLP reads as "no id"): the host, process, interval and
/// sample type hashed.
fn profile_id(resource: &ResourceLabels<'_>, time_nanos: i64, sample_type: usize) -> Vec<u8> {
    use std::hash::{Hash, Hasher};
    let half = |salt: u64| {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (
            salt,
            resource.host_name,
            resource.pid,
            time_nanos,
            sample_type,
        )
            .hash(&mut h);
        h.finish().max(1).to_le_bytes()
    };
    [half(1), half(2)].concat()
}
