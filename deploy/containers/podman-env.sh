# Sourced (". deploy/containers/podman-env.sh") by the scripts that run podman
# on these machines: exports CONTAINERS_CONF naming containers.conf with the
# path of the runtime wrapper filled in. Leaves a CONTAINERS_CONF already set
# alone (a machine with its own podman settings).
if [ -z "${CONTAINERS_CONF:-}" ]; then
  _stoker_containers=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  CONTAINERS_CONF=${TMPDIR:-/tmp}/stoker-containers.conf
  sed "s|@WRAPPER@|$_stoker_containers/runc-clamp-rlimits|" \
    "$_stoker_containers/containers.conf" >"$CONTAINERS_CONF"
  export CONTAINERS_CONF
  unset _stoker_containers
fi
