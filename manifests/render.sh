#!/usr/bin/env bash
# Renders the plain manifests in manifests/ from the Helm chart, the one source of truth:
#   agent-scheduler.yaml     everything but the CRD and the policy ConfigMap (values: plain-values.yaml)
#   configmap-sharding.yaml  the example shard-policy ConfigMap
#   rbac.yaml                the ServiceAccounts and RBAC per role alone (the local-cluster tests and the
#                            benchmarks apply these rules; reviewers read them)
#   crds/                    the chart's CRDs, copied
# Usage: manifests/render.sh [OUT_DIR]   (default: manifests/; HELM overrides the helm binary)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-$here}"
helm="${HELM:-$here/../.local/bin/helm}"
chart="$here/chart/agent-scheduler"
if [ ! -x "$helm" ]; then
  echo "render: no helm at $helm; build the pinned tools first: make tools" >&2
  exit 1
fi

header() {
  echo "# Rendered from manifests/chart/agent-scheduler by manifests/render.sh (make manifests); do not edit."
  echo "# $1"
}

mkdir -p "$out/crds"
{
  header "Namespace, ServiceAccounts and RBAC per role, coordinators, workers, PDBs, metrics Services,
# NetworkPolicies and a 3-member etcd with TLS from cert-manager (install cert-manager first). Before applying,
# create the dispatch secret and the CRD:
#   kubectl apply -f manifests/crds/ && kubectl apply -f manifests/agent-scheduler.yaml
#   kubectl -n agent-scheduler create secret generic agent-scheduler-dispatch \\
#     --from-literal=secret=\"\$(head -c 32 /dev/urandom | base64)\"
# Without cert-manager, install with Helm instead: it generates the certificates (docs/install.md)."
  "$helm" template agent-scheduler "$chart" --namespace agent-scheduler -f "$here/plain-values.yaml"
} > "$out/agent-scheduler.yaml.tmp"
{
  header "The example shard-policy ConfigMap, in the namespace the coordinator reads (docs/volcano.md)."
  "$helm" template agent-scheduler "$chart" --namespace agent-scheduler -f "$here/plain-values.yaml" \
    --set sharding.createConfigMap=true --show-only templates/sharding-configmap.yaml
} > "$out/configmap-sharding.yaml.tmp"
{
  header "The ServiceAccounts and least-privilege RBAC of each role, as in agent-scheduler.yaml (also applied by the
# local-cluster tests and the benchmarks, which bind these rules to the identity they run as)."
  "$helm" template agent-scheduler "$chart" --namespace agent-scheduler -f "$here/plain-values.yaml" \
    --show-only templates/serviceaccounts.yaml --show-only templates/rbac.yaml
} > "$out/rbac.yaml.tmp"
mv "$out/agent-scheduler.yaml.tmp" "$out/agent-scheduler.yaml"
mv "$out/rbac.yaml.tmp" "$out/rbac.yaml"
mv "$out/configmap-sharding.yaml.tmp" "$out/configmap-sharding.yaml"
cp "$chart"/crds/*.yaml "$out/crds/"
