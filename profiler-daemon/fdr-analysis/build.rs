//! Generates the pprof message types from `proto/profile.proto` (see that file). protox compiles
//! the .proto in Rust, so building needs no `protoc` on the machine.

fn main() {
    let proto = "proto/profile.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = match protox::compile([proto], ["proto"]) {
        Ok(d) => d,
        Err(e) => panic!("compiling {proto}: {e}"),
    };
    if let Err(e) = prost_build::Config::new().compile_fds(descriptors) {
        panic!("generating Rust types from {proto}: {e}");
    }
}
