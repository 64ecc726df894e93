//! Generates the KServe v2 gRPC service (`proto/grpc_predict_v2.proto`) with
//! tonic and prost; `protoc` comes from Debian's protobuf-compiler (`cargo xtask
//! setup` installs it).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/grpc_predict_v2.proto");
    tonic_prost_build::configure()
        // The tensor bytes stay `Bytes`: no copy between the frame and the tensor.
        .bytes(".inference.ModelInferRequest.raw_input_contents")
        .bytes(".inference.ModelInferResponse.raw_output_contents")
        .compile_protos(&["proto/grpc_predict_v2.proto"], &["proto"])?;
    Ok(())
}
