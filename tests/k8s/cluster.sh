#!/usr/bin/env bash
# tests/k8s/cluster.sh: a one-node Kubernetes on this machine, from the real
# components, as root: etcd (Debian's etcd-server), kube-apiserver,
# kube-controller-manager, kube-scheduler, kubelet, kube-proxy (built by
# build.sh from the Kubernetes Go module, cached by version), containerd, runc
# and the CNI bridge plugin (Debian), and CoreDNS as the cluster DNS, in a pod.
#
#   tests/k8s/cluster.sh up      build or find the binaries, install the apt
#                                packages, start everything, wait for the node
#                                to be Ready and CoreDNS to serve
#   tests/k8s/cluster.sh down    stop everything and remove its state
#   tests/k8s/cluster.sh env     print the KUBECONFIG and PATH exports:
#                                eval "$(tests/k8s/cluster.sh env)"
#   tests/k8s/cluster.sh import FILE.tar   load an image archive (podman save
#                                output) into containerd's k8s.io namespace
#
# State, certificates, logs: $STOKER_K8S_STATE (default /var/lib/stoker-k8s);
# `down` removes it. A failure in `up` runs `down` before exiting.
#
# Choices this machine needs (see tests/k8s/README.md):
# - The node's address is 10.250.0.1 on a veth pair the script creates (the
#   API server does not advertise a loopback address; no dummy driver here).
# - cgroup v1: kubelet cgroupDriver cgroupfs and failCgroupV1 false.
# - The sandbox refuses to lower oom_score_adj and keeps hard rlimits low:
#   containerd runs runc through deploy/containers/runc-clamp-rlimits, and
#   the kubelet and kube-proxy are told oomScoreAdj 0 for themselves.
# - No registry: the pause, CoreDNS and busybox images are one-layer archives
#   made here (image.py) and imported into containerd's k8s.io namespace.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD

state=${STOKER_K8S_STATE:-/var/lib/stoker-k8s}
node_ip=10.250.0.1
node_name=stoker-node
service_cidr=10.96.0.0/16
kubernetes_ip=10.96.0.1
dns_ip=10.96.0.10
cluster_cidr=10.244.0.0/16
pod_cidr=10.244.0.0/24
cni_bridge=stk-cni0
veth=stk-node0
sock=$state/run/containerd.sock

log() { echo "cluster.sh: $*" >&2; }
die() { log "$*"; exit 1; }

bin_dir() { tests/k8s/build.sh; }

# --- packages ------------------------------------------------------------------
install_deps() {
  local pkgs="etcd-server containerd runc containernetworking-plugins iptables conntrack
    busybox-static openssl gcc libc6-dev python3" missing="" p
  for p in $pkgs; do
    dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing="$missing $p"
  done
  [ -z "$missing" ] && return 0
  log "installing$missing"
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends $missing >/dev/null; }
}

# --- certificates and kubeconfigs ------------------------------------------------
pki=$state/pki
cert() { # cert NAME SUBJECT EXT: a P-256 key and a certificate signed by the CA
  local name=$1 subj=$2 ext=$3
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$pki/$name.key" -out "$pki/$name.csr" -subj "$subj" 2>/dev/null
  printf '%b\n' "$ext" >"$pki/$name.ext"
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
    -CAcreateserial -days 7 -out "$pki/$name.crt" -extfile "$pki/$name.ext" 2>/dev/null
}
make_pki() {
  mkdir -p "$pki"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 7 \
    -keyout "$pki/ca.key" -out "$pki/ca.crt" -subj /CN=stoker-k8s-ca \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
    2>/dev/null
  local client='keyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth'
  local server='keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth'
  cert apiserver /CN=kube-apiserver "$server\nsubjectAltName=DNS:kubernetes,DNS:kubernetes.default,\
DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,DNS:$node_name,\
IP:$kubernetes_ip,IP:$node_ip,IP:127.0.0.1"
  cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "$client"
  cert admin "/O=system:masters/CN=kubernetes-admin" "$client"
  cert controller-manager /CN=system:kube-controller-manager "$client"
  cert scheduler /CN=system:kube-scheduler "$client"
  cert kube-proxy /CN=system:kube-proxy "$client"
  cert kubelet-client "/O=system:nodes/CN=system:node:$node_name" "$client"
  cert kubelet "/CN=$node_name" "$server\nsubjectAltName=DNS:$node_name,IP:$node_ip"
  # The aggregation layer (Kueue's visibility API): the API server proxies
  # to extension servers with this client certificate, from its own CA.
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 7 \
    -keyout "$pki/front-proxy-ca.key" -out "$pki/front-proxy-ca.crt" -subj /CN=stoker-k8s-front-proxy-ca \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
    2>/dev/null
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$pki/front-proxy-client.key" -out "$pki/front-proxy-client.csr" \
    -subj /CN=front-proxy-client 2>/dev/null
  printf '%b\n' "$client" >"$pki/front-proxy-client.ext"
  openssl x509 -req -in "$pki/front-proxy-client.csr" -CA "$pki/front-proxy-ca.crt" \
    -CAkey "$pki/front-proxy-ca.key" -CAcreateserial -days 7 -out "$pki/front-proxy-client.crt" \
    -extfile "$pki/front-proxy-client.ext" 2>/dev/null
  openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
  chmod 600 "$pki"/*.key
}
kubeconfig() { # kubeconfig NAME CERT: $state/NAME.kubeconfig for the client cert CERT
  cat >"$state/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: stoker
  cluster:
    server: https://$node_ip:6443
    certificate-authority-data: $(base64 -w0 "$pki/ca.crt")
users:
- name: $1
  user:
    client-certificate-data: $(base64 -w0 "$pki/$2.crt")
    client-key-data: $(base64 -w0 "$pki/$2.key")
contexts:
- name: stoker
  context: {cluster: stoker, user: $1}
current-context: stoker
EOF
  chmod 600 "$state/$1.kubeconfig"
}

# --- processes -------------------------------------------------------------------
start() { # start NAME COMMAND...: in the background, its log in $state/logs
  log "starting $1"
  setsid "${@:2}" >"$state/logs/$1.log" 2>&1 </dev/null &
  echo $! >"$state/pids/$1"
}
stop() { # stop NAME: SIGTERM, then SIGKILL after 10 s
  local f=$state/pids/$1 pid i
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if kill "$pid" 2>/dev/null; then
    for i in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}
alive() { [ -f "$state/pids/$1" ] && kill -0 "$(cat "$state/pids/$1")" 2>/dev/null; }
wait_for() { # wait_for SECONDS WHAT COMMAND...: until COMMAND succeeds
  local t=$1 what=$2 i
  shift 2
  for i in $(seq "$t"); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 1
  done
  log "timed out after ${t}s waiting for $what"
  return 1
}
kc() { "$bin/kubectl" --kubeconfig "$state/admin.kubeconfig" "$@"; }

# --- images made here -------------------------------------------------------------
make_images() { # the pause, CoreDNS and busybox archives, once per CoreDNS build
  local d=$images
  mkdir -p "$d"
  [ -f "$d/pause.tar" ] || {
    gcc -O2 -static -o "$d/pause" tests/k8s/pause.c
    python3 tests/k8s/image.py "$d/pause.tar" localhost/stoker-k8s/pause:1 \
      --file "$d/pause:/pause:755" --entrypoint '["/pause"]' --user 65535
  }
  [ -f "$d/coredns.tar" ] || python3 tests/k8s/image.py "$d/coredns.tar" \
    localhost/stoker-k8s/coredns:1 --file "$bin/coredns:/coredns:755" --entrypoint '["/coredns"]'
  [ -f "$d/busybox.tar" ] || {
    local links="" a
    for a in sh cat ls sleep nslookup wget echo env hostname ip ps grep; do
      links="$links --link /bin/$a:busybox"
    done
    # shellcheck disable=SC2086
    python3 tests/k8s/image.py "$d/busybox.tar" localhost/stoker-k8s/busybox:1 \
      --file /bin/busybox:/bin/busybox:755 $links --cmd '["sh"]'
  }
}
ctr_k8s() { ctr --address "$sock" --namespace k8s.io "$@"; }

# --- up ----------------------------------------------------------------------------
up() {
  [ "$(id -u)" = 0 ] || die "up needs root"
  if [ -d "$state" ]; then
    log "a cluster is already up (or left over): run down first"
    exit 1
  fi
  install_deps
  bin=$(bin_dir)
  images=$(dirname "$bin")/images
  mkdir -p "$state"/{logs,pids,run,etcd,kubelet,cni/net.d,cni/ipam,containerd}
  trap 'log "up failed; tearing down (logs were in $state/logs)"; tail -n 20 "$state"/logs/*.log >&2 || true; down; exit 1' ERR

  # The node's address, on a veth pair (the peer only gives it a carrier).
  ip link show "$veth" >/dev/null 2>&1 ||
    ip link add "$veth" type veth peer name "${veth%0}1"
  ip addr replace "$node_ip/24" dev "$veth"
  ip link set "${veth%0}1" up
  ip link set "$veth" up
  sysctl -qw net.ipv4.ip_forward=1
  sysctl -qw net.bridge.bridge-nf-call-iptables=1 2>/dev/null || true

  make_pki
  kubeconfig admin admin
  kubeconfig controller-manager controller-manager
  kubeconfig scheduler scheduler
  kubeconfig kube-proxy kube-proxy
  kubeconfig kubelet kubelet-client

  start etcd etcd --name stoker --data-dir "$state/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster stoker=http://127.0.0.1:2380
  wait_for 30 etcd curl -fsS http://127.0.0.1:2379/health

  start kube-apiserver "$bin/kube-apiserver" \
    --advertise-address="$node_ip" --bind-address=0.0.0.0 --secure-port=6443 \
    --etcd-servers=http://127.0.0.1:2379 \
    --service-cluster-ip-range="$service_cidr" \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --allow-privileged=true \
    --client-ca-file="$pki/ca.crt" \
    --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
    --kubelet-client-certificate="$pki/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$pki/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority="$pki/ca.crt" \
    --kubelet-preferred-address-types=InternalIP,Hostname \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$pki/sa.pub" \
    --service-account-signing-key-file="$pki/sa.key" \
    --requestheader-client-ca-file="$pki/front-proxy-ca.crt" \
    --requestheader-allowed-names=front-proxy-client \
    --requestheader-username-headers=X-Remote-User \
    --requestheader-group-headers=X-Remote-Group \
    --requestheader-extra-headers-prefix=X-Remote-Extra- \
    --proxy-client-cert-file="$pki/front-proxy-client.crt" \
    --proxy-client-key-file="$pki/front-proxy-client.key" \
    --enable-aggregator-routing=true
  wait_for 120 "kube-apiserver /readyz" kc get --raw /readyz

  start kube-controller-manager "$bin/kube-controller-manager" \
    --kubeconfig="$state/controller-manager.kubeconfig" \
    --authentication-kubeconfig="$state/controller-manager.kubeconfig" \
    --authorization-kubeconfig="$state/controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --leader-elect=false \
    --use-service-account-credentials=true \
    --service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" \
    --cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key" \
    --allocate-node-cidrs=true --cluster-cidr="$cluster_cidr" --node-cidr-mask-size=24 \
    --service-cluster-ip-range="$service_cidr"
  start kube-scheduler "$bin/kube-scheduler" \
    --kubeconfig="$state/scheduler.kubeconfig" \
    --authentication-kubeconfig="$state/scheduler.kubeconfig" \
    --authorization-kubeconfig="$state/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --leader-elect=false

  # containerd with its own socket and folders, runc through the clamp.
  cat >"$state/containerd/config.toml" <<EOF
version = 2
root = "$state/containerd/root"
state = "$state/containerd/state"
[grpc]
  address = "$sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/stoker-k8s/pause:1"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$root/deploy/containers/runc-clamp-rlimits"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$state/cni/net.d"
EOF
  cat >"$state/cni/net.d/10-stoker.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "stoker-k8s", "plugins": [
  {"type": "bridge", "bridge": "$cni_bridge", "isGateway": true, "ipMasq": true,
   "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$pod_cidr"}]],
            "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$state/cni/ipam"}},
  {"type": "portmap", "capabilities": {"portMappings": true}}
]}
EOF
  start containerd containerd --config "$state/containerd/config.toml"
  wait_for 30 containerd ctr --address "$sock" version
  make_images
  local i
  for i in pause coredns busybox; do ctr_k8s images import "$images/$i.tar" >/dev/null; done

  cat >"$state/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: Webhook}
containerRuntimeEndpoint: unix://$sock
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
oomScoreAdj: 0
clusterDNS: [$dns_ip]
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
tlsCertFile: $pki/kubelet.crt
tlsPrivateKeyFile: $pki/kubelet.key
serializeImagePulls: false
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
imageGCHighThresholdPercent: 100
EOF
  start kubelet "$bin/kubelet" --config="$state/kubelet/config.yaml" \
    --kubeconfig="$state/kubelet.kubeconfig" --root-dir="$state/kubelet/root" \
    --cert-dir="$state/kubelet/pki" --hostname-override="$node_name" --node-ip="$node_ip"

  cat >"$state/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $state/kube-proxy.kubeconfig}
mode: iptables
clusterCIDR: $cluster_cidr
hostnameOverride: $node_name
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
oomScoreAdj: 0
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
  start kube-proxy "$bin/kube-proxy" --config="$state/kube-proxy.yaml"

  wait_for 120 "node $node_name Ready" kc wait --for=condition=Ready "node/$node_name" --timeout=1s
  coredns_apply
  wait_for 120 "CoreDNS ready" kc -n kube-system rollout status deployment/coredns --timeout=1s
  trap - ERR
  log "up: node $node_name Ready at $node_ip; eval \"\$(tests/k8s/cluster.sh env)\""
}

coredns_apply() {
  kc apply -f - >/dev/null <<EOF
apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: system:coredns}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: system:coredns}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: system:coredns}
subjects:
- {kind: ServiceAccount, name: coredns, namespace: kube-system}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  Corefile: |
    .:53 {
        errors
        health :8080
        ready :8181
        kubernetes cluster.local in-addr.arpa ip6.arpa {
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
        }
        prometheus :9153
        forward . /etc/resolv.conf
        cache 30
    }
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: coredns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  replicas: 1
  selector: {matchLabels: {k8s-app: kube-dns}}
  template:
    metadata: {labels: {k8s-app: kube-dns}}
    spec:
      serviceAccountName: coredns
      priorityClassName: system-cluster-critical
      dnsPolicy: Default
      containers:
      - name: coredns
        image: localhost/stoker-k8s/coredns:1
        imagePullPolicy: Never
        args: [-conf, /etc/coredns/Corefile]
        ports:
        - {name: dns, containerPort: 53, protocol: UDP}
        - {name: dns-tcp, containerPort: 53, protocol: TCP}
        - {name: metrics, containerPort: 9153, protocol: TCP}
        readinessProbe:
          httpGet: {path: /ready, port: 8181}
          periodSeconds: 2
        livenessProbe:
          httpGet: {path: /health, port: 8080}
        securityContext:
          allowPrivilegeEscalation: false
          readOnlyRootFilesystem: true
          capabilities: {add: [NET_BIND_SERVICE], drop: [ALL]}
        volumeMounts:
        - {name: config, mountPath: /etc/coredns, readOnly: true}
      volumes:
      - name: config
        configMap: {name: coredns}
---
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  clusterIP: $dns_ip
  selector: {k8s-app: kube-dns}
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
  - {name: metrics, port: 9153, protocol: TCP}
EOF
}

# --- down --------------------------------------------------------------------------
down() {
  [ "$(id -u)" = 0 ] || die "down needs root"
  set +e
  local c ns bin
  bin=$(tests/k8s/build.sh 2>/dev/null)
  if [ -d "$state/pids" ]; then
    stop kubelet
    stop kube-proxy
    # Every container and sandbox, and each sandbox's network namespace.
    if alive containerd; then
      for c in $(ctr_k8s tasks ls -q 2>/dev/null); do
        ctr_k8s tasks kill -s SIGKILL "$c" >/dev/null 2>&1
      done
      sleep 1
      for c in $(ctr_k8s containers ls -q 2>/dev/null); do
        ns=$(ctr_k8s containers info "$c" 2>/dev/null |
          python3 -c 'import json,sys
for n in json.load(sys.stdin)["Spec"]["linux"]["namespaces"]:
    if n["type"] == "network" and n.get("path"): print(n["path"])' 2>/dev/null)
        ctr_k8s tasks delete -f "$c" >/dev/null 2>&1
        ctr_k8s containers delete "$c" >/dev/null 2>&1
        if [ -n "$ns" ] && [ -e "$ns" ]; then umount "$ns" 2>/dev/null; rm -f "$ns"; fi
      done
    fi
    stop kube-scheduler
    stop kube-controller-manager
    stop kube-apiserver
    stop etcd
    stop containerd
    [ -x "$bin/kube-proxy" ] && "$bin/kube-proxy" --cleanup >/dev/null 2>&1
  fi
  # What kube-proxy --cleanup leaves (KUBE-FIREWALL, the hint chains, the
  # kubelet's canaries) and the CNI plugin's masquerade chains: the rules that
  # jump to them, then the chains.
  local cmd t rule chain
  for cmd in iptables ip6tables; do
    for t in filter nat mangle; do
      "$cmd-save" -t "$t" 2>/dev/null | grep -E '^-A .*-j (KUBE|CNI)-' | while read -r rule; do
        eval "$cmd -t $t -D ${rule#-A }" 2>/dev/null
      done
      for chain in $("$cmd-save" -t "$t" 2>/dev/null | sed -n 's/^:\(\(KUBE\|CNI\)-[^ ]*\).*/\1/p'); do
        "$cmd" -t "$t" -F "$chain" 2>/dev/null
      done
      for chain in $("$cmd-save" -t "$t" 2>/dev/null | sed -n 's/^:\(\(KUBE\|CNI\)-[^ ]*\).*/\1/p'); do
        "$cmd" -t "$t" -X "$chain" 2>/dev/null
      done
    done
  done
  # The kubelet's cgroups, empty now.
  find /sys/fs/cgroup/*/kubepods* -depth -type d -exec rmdir {} + 2>/dev/null
  ip link del "$cni_bridge" 2>/dev/null
  ip link del "$veth" 2>/dev/null
  if [ -d "$state" ]; then
    grep " $state" /proc/mounts | awk '{print $2}' | sort -r | while read -r m; do
      umount -l "$m" 2>/dev/null
    done
    rm -rf "$state"
  fi
  log "down"
  return 0
}

env_cmd() {
  bin=$(bin_dir)
  echo "export KUBECONFIG=$state/admin.kubeconfig"
  echo "export PATH=$bin:\$PATH"
  echo "export CONTAINERD_ADDRESS=$sock CONTAINERD_NAMESPACE=k8s.io"
}

case ${1:-} in
up) up ;;
down) down ;;
env) env_cmd ;;
import)
  [ -n "${2:-}" ] || die "usage: cluster.sh import FILE.tar"
  ctr_k8s images import "$2"
  ;;
*) die "usage: cluster.sh up|down|env|import FILE.tar" ;;
esac
