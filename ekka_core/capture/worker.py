"""``python -m ekka_core.capture.worker ROLE SPEC.json OUT [args]``: one capture run in a fresh process."""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

from ekka_core.contracts.errors import EkkaError
from ekka_core.contracts.spec import DiagnosisSpec


def main(argv: list[str]) -> int:
    role, spec_path, out = argv[0], Path(argv[1]), Path(argv[2])
    spec = DiagnosisSpec.from_json(json.loads(spec_path.read_text()))
    try:
        if role == "target":
            if spec.target == "vllm":
                from ekka_core.capture import vllm_runner
                vllm_runner.run(spec, out)
            else:
                from ekka_core.capture import sglang_runner
                sglang_runner.run(spec, out)
        elif role == "reference":
            from ekka_core.capture import hf_runner
            from ekka_core.capture.trace import Trace
            target = Trace(argv[3])
            fp32_out = Path(argv[4])
            ids, lens = target.run.token_ids, target.run.prompt_lens
            hf_runner.run(spec, ids, lens, spec.dtype, "reference", out)
            hf_runner.run(spec, ids, lens, "float32", "reference-fp32", fp32_out)
        else:
            raise ValueError(f"unknown role {role}")
    except EkkaError as e:
        print(json.dumps({"ekka_error": {"message": e.message, "fix": e.fix, "exit_code": e.exit_code}}),
              file=sys.stderr)
        return e.exit_code
    except Exception as e:  # noqa: BLE001 - report anything else as an internal failure with its traceback
        traceback.print_exc()
        print(json.dumps({"ekka_error": {"message": f"{type(e).__name__}: {e}", "fix": None, "exit_code": 3}}),
              file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
