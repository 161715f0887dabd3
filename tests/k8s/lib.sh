# What tests/k8s/run and tests/k8s/elastic-bench share (sourced by both):
# stokerctl in the overlay's stokerctl pod, the coordinator's view of a job,
# Kueue's Workloads and ClusterQueues, the small busybox jobs that stand in
# for other teams' workloads, and the test overlay's training Job rendered
# under another name. Every function reads $ns (the namespace), and the ones
# about a Stoker job read $job (its name at the coordinator); $work is the
# suite's work folder (its overlay).

ctl() { kubectl -n "$ns" exec stokerctl -- stokerctl "$@"; }

job_field() { # job_field FIELD: a field of `stokerctl --json job show "$job"`
  ctl --json job show "$job" 2>/dev/null | python3 -c "
import json, sys
j = json.load(sys.stdin)
j['step'] = max([m['step'] for m in j['members']] or [0])
j['checkpoint_step'] = (j.get('latest_checkpoint') or {}).get('step', 0)
print(j.get(sys.argv[1], 0))" "$1" 2>/dev/null
}
wait_field() { # wait_field FIELD OP VALUE SECONDS
  local i v
  for i in $(seq "$4"); do
    v=$(job_field "$1")
    [ -n "$v" ] && test "$v" "$2" "$3" && { echo "  $1 = $v"; return 0; }
    sleep 1
  done
  echo "  $1 = ${v:-?} after $4 s"
  return 1
}

# Kueue: the Job's newest Workload (the one it owns), its conditions.
wl_json() { # wl_json JOB: the newest Workload of Job JOB as JSON ("{}" when none)
  kubectl -n "$ns" get workloads -o json 2>/dev/null | python3 -c '
import json, sys
job = sys.argv[1]
wls = [w for w in json.load(sys.stdin)["items"]
       if any(o.get("kind") == "Job" and o.get("name") == job
              for o in w["metadata"].get("ownerReferences", []))]
wls.sort(key=lambda w: w["metadata"]["creationTimestamp"])
print(json.dumps(wls[-1] if wls else {}))' "$1"
}
wl_cond() { # wl_cond JOB CONDITION: its status (True/False; empty when unset)
  wl_json "$1" | python3 -c '
import json, sys
w = json.load(sys.stdin)
print({c["type"]: c["status"] for c in w.get("status", {}).get("conditions", [])}.get(sys.argv[1], ""))' "$2"
}
wl_show() { # one line per Workload of the namespace
  kubectl -n "$ns" get workloads -o custom-columns='WORKLOAD:.metadata.name,JOB:.metadata.ownerReferences[0].name,QUEUE:.spec.queueName,PRIORITY:.spec.priority,RESERVED:.status.conditions[?(@.type=="QuotaReserved")].status,ADMITTED:.status.conditions[?(@.type=="Admitted")].status,EVICTED:.status.conditions[?(@.type=="Evicted")].status,FINISHED:.status.conditions[?(@.type=="Finished")].reason' 2>&1 |
    sed 's/^/  /'
}
job_suspended() { kubectl -n "$ns" get job "$1" -o jsonpath='{.spec.suspend}'; }
job_pod_count() { # job_pod_count JOB [PHASE]: its pods (in PHASE)
  kubectl -n "$ns" get pods -l "batch.kubernetes.io/job-name=$1" \
    ${2:+--field-selector=status.phase=$2} -o name 2>/dev/null | grep -c .
}

# Small Indexed Jobs of busybox pods (50m/64Mi each) for Kueue's queueing and
# preemption: busy_job NAME PRIORITY PODS SECONDS [LOCALQUEUE]. A pod writes the
# time of the SIGTERM it gets into its termination message and exits 143 2 s later.
busy_job() {
  cat <<EOF
apiVersion: batch/v1
kind: Job
metadata:
  name: $1
  namespace: $ns
  labels: {kueue.x-k8s.io/queue-name: ${5:-stoker}, kueue.x-k8s.io/priority-class: $2}
  annotations: {kueue.x-k8s.io/elastic-job: "true"}
spec:
  suspend: true
  completionMode: Indexed
  completions: $3
  parallelism: $3
  backoffLimit: 6
  template:
    metadata: {labels: {app.kubernetes.io/name: kueue-check}}
    spec:
      restartPolicy: Never
      terminationGracePeriodSeconds: 10
      containers:
      - name: work
        image: localhost/stoker-k8s/busybox:1
        imagePullPolicy: Never
        command:
        - sh
        - -c
        - trap 'echo "SIGTERM at \$(busybox date +%s)" >/dev/termination-log; sleep 2; exit 143' TERM;
          sleep $4 & wait
        resources:
          requests: {cpu: 50m, memory: 64Mi}
EOF
}

resize() { # resize JOB N: parallelism and completions together (an Indexed Job)
  kubectl -n "$ns" patch job "$1" --type=merge \
    -p "{\"spec\":{\"parallelism\":$2,\"completions\":$2}}" >/dev/null
}

wl_count() { # wl_count JOB: the workloads of JOB not finished
  kubectl -n "$ns" get workloads -o json | python3 -c '
import json, sys
print(sum(1 for w in json.load(sys.stdin)["items"]
          if any(o.get("name") == sys.argv[1] for o in w["metadata"].get("ownerReferences", []))
          and not any(c["type"] == "Finished" and c["status"] == "True"
                      for c in w.get("status", {}).get("conditions", []))))' "$1"
}

cq_cpu() { # cq_cpu [CLUSTERQUEUE]: the CPU it has reserved
  kubectl get clusterqueue "${1:-baseline}" -o jsonpath='{.status.flavorsReservation[0].resources[?(@.name=="cpu")].total}'
}

events() { # the coordinator's events of $job, one JSON object a line
  kubectl -n "$ns" exec stokerctl -- timeout 3 stokerctl --json job watch "$job" 2>/dev/null |
    python3 -c '
import json, sys
text, dec, i = sys.stdin.read(), json.JSONDecoder(), 0
while True:
    while i < len(text) and text[i].isspace():
        i += 1
    if i >= len(text):
        break
    o, i = dec.raw_decode(text, i)
    print(json.dumps(o))'
}

parallelism() { kubectl -n "$ns" get job "$1" -o jsonpath='{.spec.parallelism}'; }

# train_job NAME STOKER_JOB LOCALQUEUE STEPS [TRAIN-FLAG]...: the test overlay's
# training Job (the example's, as rendered for this cluster) as JSON, named
# NAME, its Stoker job STOKER_JOB, in LOCALQUEUE, STEPS steps, the trainer's
# command line given TRAIN-FLAGs more; with TRAIN_CPU_LIMIT set, the rank's
# container is limited to that much CPU.
train_job() {
  kubectl kustomize "$work/overlay" | python3 -c '
import json, os, sys, yaml
name, job, queue, steps, *extra = sys.argv[1:]
for d in yaml.safe_load_all(sys.stdin):
    if d and d["kind"] == "Job" and d["metadata"]["name"] == "train-demo":
        break
d["metadata"]["name"] = name
d["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = queue
t = d["spec"]["template"]
t["metadata"]["labels"]["stoker.io/job"] = job
for c in t["spec"]["initContainers"] + t["spec"]["containers"]:
    for e in c.get("env", []):
        if e["name"] == "STOKER_JOB":
            e["value"] = job
        if e["name"] == "STEPS":
            e["value"] = steps
    if c["name"] == "train" and extra:
        c["command"][-1] += " " + " ".join(extra)
    if c["name"] == "train" and os.environ.get("TRAIN_CPU_LIMIT"):
        c.setdefault("resources", {}).setdefault("limits", {})["cpu"] = os.environ["TRAIN_CPU_LIMIT"]
print(json.dumps(d))' "$@"
}
