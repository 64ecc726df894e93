# syntax=docker/dockerfile:1
#
# The sluice image: the `sluice` binary, the built-in policies and ONNX Runtime's
# shared library on a slim Debian, run as the non-root user `sluice` (uid 10001,
# the uid deploy/kubernetes runs it as). From the repository root:
#
#   docker build -t sluice:0.1.0 .
#
# docs/cluster.md ("Kubernetes") says how to load it into kind, minikube or a
# registry. Base images are pinned by tag (a Rust release, a Debian release); pin
# them by digest (`image:tag@sha256:...`) where a rebuild must give the same bytes.

# ---- 1. The binary and the built-in policies ------------------------------------
# The release binary needs cmake, g++ and libclang (HiGHS, the allocator's MILP
# solver, is built from source and bound with bindgen) and protoc (the gRPC
# service): xtask's DEBIAN_PACKAGES. The policies are WebAssembly components for
# wasm32-unknown-unknown, linked by wasm-component-ld, which ships with rustc.
FROM rust:1.95.0-slim-bookworm AS build
# Debian's archive keeps only the newest version of a stable release's package, so a
# pinned version breaks the build at the next point release; the release itself is
# pinned by the base image's tag.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends cmake g++ make libclang-dev protobuf-compiler \
    && rm -rf /var/lib/apt/lists/*
RUN rustup target add wasm32-unknown-unknown
WORKDIR /src
COPY . .
# BuildKit keeps the crates and the target directory between builds (cache mounts);
# what the image needs is copied out of the cached target directory to /out.
# `cargo xtask policies` writes target/policies/<name>.wasm (xtask/src/policies.rs).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p sluice \
    && cargo xtask policies \
    && mkdir -p /out/policies \
    && cp target/release/sluice /out/sluice \
    && cp target/policies/*.wasm /out/policies/

# ---- 2. ONNX Runtime's shared library ------------------------------------------
# The onnxruntime wheel from PyPI carries libonnxruntime.so (CPU only): the same
# 1.31.1 that `cargo xtask setup` installs. Only the library is kept; the runtime
# image has no Python.
FROM python:3.11-slim-bookworm AS onnxruntime
WORKDIR /wheels
RUN pip download --no-cache-dir --no-deps --only-binary=:all: --dest /wheels onnxruntime==1.31.1 \
    && python -m zipfile -e /wheels/onnxruntime-1.31.1-*.whl /wheels/unpacked \
    && install -D -m 0644 /wheels/unpacked/onnxruntime/capi/libonnxruntime.so.1.31.1 \
        /out/libonnxruntime.so.1.31.1

# ---- 3. The runtime -------------------------------------------------------------
# The same Debian release as the build stage, so the binary finds the glibc and
# libstdc++ it was linked against (checked below with ldd).
FROM debian:bookworm-slim
# A fixed uid and gid: Kubernetes' runAsNonRoot can only check a numeric USER.
# The directories sluice writes (uploaded policies, the compile cache) belong to
# it; with a read-only root filesystem they are volumes (deploy/kubernetes).
RUN groupadd --gid 10001 sluice \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin sluice \
    && install -d -o 10001 -g 10001 /var/lib/sluice/policies /var/cache/sluice
COPY --from=build /out/sluice /usr/local/bin/sluice
# The config's builtin_policy_dir (deploy/kubernetes/config.yaml).
COPY --from=build /out/policies/ /usr/share/sluice/policies/
COPY --from=onnxruntime /out/libonnxruntime.so.1.31.1 /usr/lib/sluice/libonnxruntime.so.1.31.1
# ORT_DYLIB_PATH: where sluice loads ONNX Runtime from (README, "Running").
# SLUICE_COMPILE_CACHE: compiled policies (docs/host.md); without it the cache
# would go to the home directory, which this user does not have.
ENV ORT_DYLIB_PATH=/usr/lib/sluice/libonnxruntime.so.1.31.1 \
    SLUICE_COMPILE_CACHE=/var/cache/sluice
# Fails the build if a shared library the binary or ONNX Runtime needs is missing
# (or if ldd itself fails), and shows that the binary runs.
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN libs="$(ldd /usr/local/bin/sluice /usr/lib/sluice/libonnxruntime.so.1.31.1)" \
    && if grep -q "not found" <<<"$libs"; then echo "$libs" >&2; exit 1; fi \
    && /usr/local/bin/sluice --version
USER 10001:10001
# 8000: a frontend's (or the single process's) HTTP; 8001: an agent's batches.
EXPOSE 8000 8001
ENTRYPOINT ["/usr/local/bin/sluice"]
CMD ["--help"]
