"""The trial process: `python -m autotune.trial REQUEST RESULT PARENT_PID`.

Runs one measurement in a fresh interpreter (a CUDA OOM or illegal access can poison a
process; compile caches and DataLoader workers leak across runs) and writes the result as
JSON. It dies with the tuner: PR_SET_PDEATHSIG delivers SIGKILL if the parent goes first."""

from __future__ import annotations

import json
import os
import sys
import time

from autotune.trial._proc import die_with_parent


def main(argv: list[str]) -> int:
    started = time.time()
    request_path, result_path, parent_pid = argv[0], argv[1], int(argv[2])
    die_with_parent(parent_pid)
    with open(request_path, encoding="utf-8") as f:
        request = json.load(f)

    from autotune.config import RunSpec, TrainConfig
    from autotune.device import DeviceInfo
    from autotune.errors import AutotuneError
    from autotune.measure import outcomes
    from autotune.measure.loop import measure
    from autotune.measure.measurement import Measurement

    ready = time.time()
    spec = RunSpec.from_dict(request["spec"])
    cfg = TrainConfig.from_dict(request["config"])
    info = DeviceInfo.from_dict(request["device"]) if request.get("device") else None
    try:
        result = measure(spec, cfg, info)
    except AutotuneError as exc:  # bad input reaching a trial: record it, don't crash
        result = Measurement.failed(cfg.to_dict(), *outcomes.bad_input_in_trial(exc))
    result.phase_s["process_start"] = ready - started  # interpreter + imports, seen from inside
    payload = {"measurement": result.to_dict(), "started_at": started, "ready_at": ready}
    tmp = result_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(payload, f)
    os.replace(tmp, result_path)  # atomic: the runner never reads half a result
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    # The result is on disk and the DataLoader workers are shut down: skip the interpreter's
    # shutdown (torch's finalizers and module teardown take ~1 s per trial; see
    # benchmarks/overhead.py) and let the runner's process-group kill clean up the rest.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
