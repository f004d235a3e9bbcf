#!/usr/bin/env bash
# A kind cluster for a person with Docker: two workers, each over its own simulated GPU node
# (worker 0: 2x H100-80GB, worker 1: 2x A100-40GB), tessera installed by the chart, the
# examples applied. NOT RUN on the machines tessera is developed on (no Docker daemon there):
# see README.md in this folder for what was and was not run.
#
#   e2e/kind/up.sh            create (or reuse) the cluster and install tessera
#   e2e/kind/up.sh down       delete it
#
# Needs: docker, kind, kubectl, helm on PATH; run from anywhere inside the repository.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
HERE="$REPO/e2e/kind"
STATE="$HERE/.state"
NAME=tessera
NAMESPACE=tessera-system
OPERATOR_IMAGE=${TESSERA_OPERATOR_IMAGE:-tessera-operator:dev}
NODE_IMAGE=${TESSERA_NODE_IMAGE:-tessera-node:dev}

die() { echo "e2e/kind/up.sh: $*" >&2; exit 1; }

if [ "${1:-}" = down ]; then
    kind delete cluster --name "$NAME"
    rm -rf "$STATE"
    exit 0
fi

for tool in docker kind kubectl helm make; do
    command -v "$tool" >/dev/null || die "$tool is not on PATH"
done
docker info >/dev/null 2>&1 || die "no Docker daemon answers (docker info failed)"

# 1. The simulated GPU node: libcuda.so.1, libnvidia-ml.so.1 and nvidia-smi, built from sim/
#    (glibc-linked: build on a distribution no newer than the kind node image's Debian).
make -C "$REPO" sim
PY="$REPO/.venv/bin/python"
mkdir -p "$STATE/worker-0" "$STATE/worker-1"
PYTHONPATH="$REPO/sim" "$PY" -m tessera_sim node --gpu H100-80GB --gpu H100-80GB \
    --seed kind-worker-0 --out "$STATE/worker-0/node.conf"
PYTHONPATH="$REPO/sim" "$PY" -m tessera_sim node --gpu A100-40GB --gpu A100-40GB \
    --seed kind-worker-1 --out "$STATE/worker-1/node.conf"

# 2. The cluster, its workers mounting the simulator and their own node state.
config="$STATE/kind-config.yaml"
sed -e "s|@SIM_BUILD@|$REPO/sim/build|g" -e "s|@STATE@|$STATE|g" \
    "$HERE/kind-config.yaml" > "$config"
if ! kind get clusters | grep -qx "$NAME"; then
    kind create cluster --config "$config" --wait 120s
fi
kubectl config use-context "kind-$NAME"

# 3. Images: built by the chart's image build (TESSERA_OPERATOR_IMAGE / TESSERA_NODE_IMAGE
#    name images you built yourself), then loaded into the kind nodes (no registry).
for image in "$OPERATOR_IMAGE" "$NODE_IMAGE"; do
    docker image inspect "$image" >/dev/null 2>&1 || die "image $image not found: build it \
first (see charts/ and e2e/kind/README.md)"
    kind load docker-image --name "$NAME" "$image"
done

# 4. tessera by its chart, the daemons pointed at the simulator on each worker.
helm upgrade --install tessera "$REPO/charts/tessera" --namespace "$NAMESPACE" \
    --create-namespace -f "$HERE/values.yaml" \
    --set-string "operator.image=$OPERATOR_IMAGE" --set-string "nodeDaemon.image=$NODE_IMAGE" \
    --wait --timeout 5m

# 5. The examples (namespaces first), then what an operator of tessera sees.
kubectl apply -f "$REPO/examples/00-namespace.yaml"
kubectl apply -f "$REPO/examples/"
kubectl get tessera -A
echo "kind cluster $NAME is up: kubectl --context kind-$NAME get gpupartitions -w"
