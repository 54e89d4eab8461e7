//! Generates the pprof message types from `proto/profile.proto` and Perfetto's trace messages
//! from `proto/perfetto_trace.proto` (see those files). protox compiles the .proto files in
//! Rust, so building needs no `protoc` on the machine.

fn main() {
    let protos = ["proto/profile.proto", "proto/perfetto_trace.proto"];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = match protox::compile(protos, ["proto"]) {
        Ok(d) => d,
        Err(e) => panic!("compiling {protos:?}: {e}"),
    };
    if let Err(e) = prost_build::Config::new().compile_fds(descriptors) {
        panic!("generating Rust types from {protos:?}: {e}");
    }
}
