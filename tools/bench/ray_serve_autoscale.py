"""kev.serve's autoscaling on queued work, on a local 2-CPU Ray cluster: kev-mini, `replicas: auto` between 1
and 2 replicas, 2 requests in flight per replica as the target; 8 clients send decisions until a second replica
runs, then stop, and the deployment is watched going back to one. Prints when each happened.

    target/python-venv/bin/python tools/bench/ray_serve_autoscale.py     # needs pip install ./python[serve]
"""
import json, os, sys, time, threading, http.client
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
import ray
from ray import serve
from kev.serve import build_app
ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
serve.start(http_options={"host": "127.0.0.1", "port": 18123})
t0 = time.time()
serve.run(build_app({"demo": True, "replicas": "auto", "min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 2,
                     "upscale_delay_s": 2, "downscale_delay_s": 10, "cpus_per_replica": 0.5, "threads_per_replica": 1}), name="kev", route_prefix="/")
def running():
    st = serve.status().applications["kev"].deployments["KevReplica"]
    return st.replica_states.get("RUNNING", 0)
print(f"deployed in {time.time()-t0:.1f}s; running replicas {running()}", flush=True)
stop = threading.Event(); done = [0]
def load(k):
    c = http.client.HTTPConnection("127.0.0.1", 18123, timeout=300); i = 0
    while not stop.is_set():
        body = json.dumps({"state": "Ticket %d %d: " % (k, i) + "word " * 400, "questions": {"q": {"type": "noul"}}}).encode()
        c.request("POST", "/v1/systemone", body=body, headers={"content-type": "application/json"}); r = c.getresponse(); r.read()
        assert r.status == 200, r.status
        done[0] += 1; i += 1
ts = [threading.Thread(target=load, args=(k,)) for k in range(8)]
[t.start() for t in ts]
t1 = time.time(); seen = []
while time.time() - t1 < 90:
    n = running(); seen.append((round(time.time()-t1), n))
    if n == 2: break
    time.sleep(2)
print("under load (8 clients):", seen[-5:], "answered", done[0], flush=True)
stop.set(); [t.join() for t in ts]
t2 = time.time()
while time.time() - t2 < 90:
    if running() == 1: break
    time.sleep(2)
print(f"after load: running {running()} ({time.time()-t2:.0f}s after the load stopped)", flush=True)
serve.shutdown(); ray.shutdown()
