"""Label a corpus with Kev on a Ray cluster: Ray Data reads the documents, a pool of actors each holding
one ``kev.Model`` answers them in batches, Ray Data writes the responses.

    python ray_decide.py --base BASE --kev KEV --questions questions.json \
        --input docs.jsonl --out responses/ --actors 8 --cpus-per-actor 4

Input: JSON lines ``{"id": ..., "text": ...}`` (``--id-field`` / ``--text-field`` rename them; other fields
are ignored). Every document is asked the same questions (``--questions``: the request's ``questions``
map, as JSON). Output: JSON lines ``{"id": ..., "response": "..."}`` where ``response`` is the exact body
``POST /v1/systemone`` would return for ``{"state": text, "questions": ...}`` (or, for a refused document,
``{"status": 422, "body": ...}``), as text, so it is byte-equal to ``kev decide --jsonl``'s line for it.

Knobs (see python/README.md): ``--actors`` (models alive at once: each holds a copy of the weights),
``--cpus-per-actor`` (what Ray reserves per actor, and the size of its engine thread pool unless
``--threads-per-actor`` says otherwise), ``--batch-size`` (documents per call: their rows share forward
passes and the GIL is released for the whole batch).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any, Dict, Optional

import ray

import kev


class Decider:
    """One ``kev.Model`` per actor, loaded once when the actor starts."""

    def __init__(
        self,
        model_args: Dict[str, Any],
        questions: Dict[str, Any],
        id_field: str,
        text_field: str,
        threads: Optional[int],
    ) -> None:
        self.model = kev.Model(threads=threads, **model_args)
        self.questions = questions
        self.id_field, self.text_field = id_field, text_field

    def __call__(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        texts = list(batch[self.text_field])
        lines = self.model.decide_jsonl([request_for(t, self.questions) for t in texts])
        return {"id": list(batch[self.id_field]), "response": lines}


def request_for(text: Any, questions: Dict[str, Any]) -> Dict[str, Any]:
    """The request the pipeline sends for one document (for building the same input for other tools)."""
    return {"state": text, "questions": questions}


def run(
    *,
    model_args: Dict[str, Any],
    questions: Dict[str, Any],
    input_path: str,
    out_dir: str,
    actors: int = 2,
    cpus_per_actor: float = 1.0,
    threads_per_actor: Optional[int] = None,
    batch_size: int = 16,
    id_field: str = "id",
    text_field: str = "text",
) -> None:
    """Build and run the pipeline (Ray must be initialised)."""
    threads = threads_per_actor or max(1, int(cpus_per_actor))
    # Parsing and writing JSON lines is light next to the model: those tasks reserve no CPU, so that the
    # actors can hold every CPU of the cluster without starving the reads that feed them.
    ds = ray.data.read_json(input_path, num_cpus=0)
    ds = ds.map_batches(
        Decider,
        fn_constructor_kwargs={
            "model_args": model_args,
            "questions": questions,
            "id_field": id_field,
            "text_field": text_field,
            "threads": threads,
        },
        batch_size=batch_size,
        batch_format="default",
        # A fixed pool of `actors` actors (older Ray spells it `concurrency=actors`).
        compute=ray.data.ActorPoolStrategy(size=actors),
        num_cpus=cpus_per_actor,
    )
    ds.write_json(out_dir, ray_remote_args={"num_cpus": 0})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="a prepared model directory (kev prepare)")
    p.add_argument("--base", help="the base release directory (with --kev)")
    p.add_argument("--kev", help="the Kev release directory (with --base)")
    p.add_argument("--weights", default="merged", choices=["merged", "exact"])
    p.add_argument("--precision", choices=["fp32", "bf16"])
    p.add_argument("--questions", required=True, help="JSON file: the questions map every document is asked")
    p.add_argument("--input", required=True, help="JSONL documents (a file or a directory of them)")
    p.add_argument("--out", required=True, help="directory for the JSONL responses")
    p.add_argument("--id-field", default="id")
    p.add_argument("--text-field", default="text")
    p.add_argument("--actors", type=int, default=2, help="kev.Model actors in the pool")
    p.add_argument("--cpus-per-actor", type=float, default=1.0, help="CPUs Ray reserves for each actor")
    p.add_argument("--threads-per-actor", type=int, help="engine threads per actor (default: its CPUs)")
    p.add_argument("--batch-size", type=int, default=16, help="documents per call into the model")
    p.add_argument("--address", help="a running Ray cluster (default: start a local one)")
    a = p.parse_args()
    model_args: Dict[str, Any] = {"weights": a.weights, "precision": a.precision}
    if a.model:
        model_args["model_dir"] = os.path.abspath(a.model)
    else:
        model_args["base"], model_args["kev"] = os.path.abspath(a.base), os.path.abspath(a.kev)
    with open(a.questions, encoding="utf-8") as f:
        questions = json.load(f)
    ray.init(address=a.address)
    t0 = time.perf_counter()
    run(
        model_args=model_args,
        questions=questions,
        input_path=os.path.abspath(a.input),
        out_dir=os.path.abspath(a.out),
        actors=a.actors,
        cpus_per_actor=a.cpus_per_actor,
        threads_per_actor=a.threads_per_actor,
        batch_size=a.batch_size,
        id_field=a.id_field,
        text_field=a.text_field,
    )
    print(f"ray_decide: done in {time.perf_counter() - t0:.1f} s → {a.out}")


if __name__ == "__main__":
    main()
