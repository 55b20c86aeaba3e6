"""Fail unless a jevcompat JSON report has no MUST or SHOULD failing, no MUST untested, and (with
--expect-auth) the three auth requirements passing. A requirement the server never gives occasion to
(errors.shape: kev accepts any model name, as Kev does) is reported as not exercised, not failed. usage: check_report.py REPORT.json [--expect-auth]"""
import json
import sys

report = json.load(open(sys.argv[1]))
s = report["summary"]
problems = []
for level in ("MUST", "SHOULD"):
    if s[level]["failed"]:
        failed = [r for r in report["results"] if r.get("level") == level and r.get("status") == "fail"]
        problems.append(f"{level}: {s[level]['failed']} failed {[r.get('id') for r in failed]}")
if s["untested_musts"]:
    problems.append(f"untested MUSTs: {s['untested_musts']}")
if report.get("inconclusive"):
    problems.append(f"inconclusive: {report['inconclusive']}")
if report.get("case_errors"):
    problems.append(f"case errors: {report['case_errors']}")
if "--expect-auth" in sys.argv:
    status = {r.get("id"): r.get("status") for r in report["results"]}
    for rid in ("auth.bearer", "auth.missing", "auth.invalid"):
        if status.get(rid) != "pass":
            problems.append(f"{rid} is {status.get(rid)} with a key given")
line = (f"jevcompat {sys.argv[1]}: MUST {s['MUST']['passed']}/{s['MUST']['tested']} passed, "
        f"SHOULD {s['SHOULD']['passed']}/{s['SHOULD']['tested']} passed, verdict {s['verdict']}")
print(line)
if problems:
    print("\n".join(problems))
    sys.exit(1)
