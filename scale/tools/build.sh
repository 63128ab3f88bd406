#!/usr/bin/env bash
# Builds the pinned Kubernetes tools (kube-apiserver, kube-scheduler, kube-controller-manager, etcd, kwok,
# helm) into a bin folder.
#
# Each tool comes from its own Go module under scale/tools/<module>/, so their dependency graphs never
# have to agree with each other. A tool is rebuilt only when its module files (go.mod, go.sum) or this
# script changed since the last successful build: the hash of those inputs is kept beside the binary.
#
# Usage: scale/tools/build.sh [BIN_DIR] [TOOL...]   (default BIN_DIR .local/bin, default tools: all five)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="$(mkdir -p "${1:-$here/../../.local/bin}" && cd "${1:-$here/../../.local/bin}" && pwd)"
shift || true
tools=("$@")
[ ${#tools[@]} -gt 0 ] || tools=(etcd kwok kube-apiserver kube-scheduler kube-controller-manager helm)

export GOFLAGS="${GOFLAGS:--buildvcs=false}"
export CGO_ENABLED=0
k8s_version="v1.36.3"
helm_version="v3.19.5"

module_of() {
  case "$1" in
    kube-apiserver|kube-scheduler|kube-controller-manager) echo kubernetes ;;
    etcd) echo etcd ;;
    kwok) echo kwok ;;
    helm) echo helm ;;
    *) echo "unknown tool: $1 (known: etcd kwok kube-apiserver kube-scheduler kube-controller-manager helm)" >&2; return 1 ;;
  esac
}

package_of() {
  case "$1" in
    kube-apiserver) echo k8s.io/kubernetes/cmd/kube-apiserver ;;
    kube-scheduler) echo k8s.io/kubernetes/cmd/kube-scheduler ;;
    kube-controller-manager) echo k8s.io/kubernetes/cmd/kube-controller-manager ;;
    etcd) echo . ;;
    kwok) echo sigs.k8s.io/kwok/cmd/kwok ;;
    helm) echo helm.sh/helm/v3/cmd/helm ;;
  esac
}

ldflags_of() {
  case "$1" in
    kube-apiserver|kube-scheduler|kube-controller-manager)
      local minor="${k8s_version#v1.}"; minor="${minor%%.*}"
      local cb=k8s.io/component-base/version
      echo "-s -w -X $cb.gitVersion=$k8s_version -X $cb.gitMajor=1 -X $cb.gitMinor=$minor" \
        "-X $cb.gitTreeState=clean -X $cb.buildDate=1970-01-01T00:00:00Z" ;;
    etcd) echo "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=v3.6.16" ;;
    kwok) echo "-s -w" ;;
    helm) echo "-s -w -X helm.sh/helm/v3/internal/version.version=$helm_version" \
      "-X helm.sh/helm/v3/internal/version.gitTreeState=clean" ;;
  esac
}

inputs_hash() {
  local dir="$here/$1"
  cat "$dir/go.mod" "$dir/go.sum" "$here/build.sh" $(ls "$dir"/*.go 2>/dev/null) | sha256sum | cut -d' ' -f1
}

for tool in "${tools[@]}"; do
  module="$(module_of "$tool")"
  stamp="$bin/.$tool.inputs"
  want="$(inputs_hash "$module")"
  if [ -x "$bin/$tool" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    echo "build: $tool is up to date ($bin/$tool)"
    continue
  fi
  echo "build: $tool from module scale/tools/$module ..."
  start=$(date +%s)
  if ! (cd "$here/$module" && go build -trimpath -ldflags "$(ldflags_of "$tool")" -o "$bin/$tool.tmp" "$(package_of "$tool")"); then
    echo "build: FAILED to build $tool (Go module scale/tools/$module)." >&2
    echo "build: retry with: scale/tools/build.sh '$bin' $tool" >&2
    rm -f "$bin/$tool.tmp"
    exit 1
  fi
  mv "$bin/$tool.tmp" "$bin/$tool"
  echo "$want" > "$stamp"
  echo "build: $tool done in $(( $(date +%s) - start ))s"
done
