#!/usr/bin/env bash
# GPU check: Ekka on a CUDA machine, end to end, in one go (< 8 minutes on one GPU once the engines are installed).
#
#   bash scripts/gpu-check.sh
#
# 1. picks a Python with CUDA torch (EKKA_PYTHON, else .venv/bin/python, else python3) and installs what is missing:
#    vLLM (CUDA build): wheels carried in wheels/ (pip --no-index), else `EKKA_VLLM=cuda bash scripts/setup.sh`;
#    Ekka's light dependencies likewise; SGLang into its own venv (.ekka-cache/venv-sglang) layered over that
#    Python's packages, so its pins never touch vLLM's environment. Without a GPU nothing is installed;
# 2. vLLM-CUDA diagnosis of a tiny zoo Gemma 3 with vLLM's sliding-window bug re-injected (expects: divergent,
#    rank 1 model.layers.3.self_attn.attn), then the same model clean (expects: consistent);
# 3. SGLang through Ekka: a traced diagnosis of a tiny zoo Llama with --target sglang (expects: a complete SGLang
#    trace with every fed token traced once, and the verdict consistent), then SGLang's own greedy generate on the
#    same model compared token by token with HF Transformers' greedy generate (tells "SGLang broken here" apart
#    from "Ekka's SGLang tracing broken").
#
# Prints one PASS/FAIL line per step with its time, the verdicts, and a summary table. Never stops at a failed
# step; exit status 0 only if every step passed. Environment: EKKA_PYTHON (interpreter), EKKA_WHEELS (wheel dir,
# default wheels/), EKKA_GPU_CHECK_OUT (output dir, default ekka-out/gpu-check), EKKA_GPU_CHECK_BUDGET (seconds for
# everything after the installs, default 420), EKKA_GPU_CHECK_INSTALL_BUDGET (seconds for installs, default 300).
set -u
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 3

out="${EKKA_GPU_CHECK_OUT:-$root/ekka-out/gpu-check}"
wheels="${EKKA_WHEELS:-$root/wheels}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 EKKA_ZOO_DIR="${EKKA_ZOO_DIR:-$out/zoo}" TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1    # zoo models are local; nothing is downloaded at run time

names=(); statuses=(); times=(); notes=()
say() { printf '[gpu-check] %s\n' "$*"; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
record() {  # NAME STATUS SECONDS NOTE
  names+=("$1"); statuses+=("$2"); times+=("$3"); notes+=("$4")
  printf '%s %-34s %7ss  %s\n' "$2" "$1" "$3" "$4"
}

# run_step NAME LIMIT_S DEADLINE_VAR CMD...: run with a timeout (the step's limit or what the budget has left),
# log to $out/NAME.log; sets $step_rc and $step_s. Never exits.
run_step() {
  local name="$1" limit="$2" deadline="$3"; shift 3
  local left=$(( deadline - SECONDS ))
  [ "$left" -lt "$limit" ] && limit="$left"
  if [ "$limit" -lt 15 ]; then
    step_rc=124; step_s=0.0
    echo "no time left in the budget" > "$out/$name.log"
    return
  fi
  local t0; t0="$(now)"
  timeout --kill-after=15 "$limit" "$@" > "$out/$name.log" 2>&1
  step_rc=$?
  step_s="$(elapsed "$t0")"
  if [ "$step_rc" -eq 124 ] || [ "$step_rc" -eq 137 ]; then
    echo "[gpu-check] timed out after ${limit}s" >> "$out/$name.log"
  fi
}
log_tail() { tail -n "${2:-3}" "$out/$1.log" 2>/dev/null | tr '\n' ' ' | cut -c1-300; }

# --- 0. the machine --------------------------------------------------------------------------------------------
t0="$(now)"
gpu_ok=0
if command -v nvidia-smi >/dev/null 2>&1 && gpu="$(nvidia-smi -L 2>/dev/null | head -1)" && [ -n "$gpu" ]; then
  gpu_ok=1
  record gpu PASS "$(elapsed "$t0")" "$gpu"
else
  record gpu FAIL "$(elapsed "$t0")" "nvidia-smi sees no GPU: nothing is installed; the checks run on what is there (CPU)"
fi

cuda_ok() { "$1" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; }
has() { "$1" -c "import $2" >/dev/null 2>&1; }

# The first candidate with CUDA torch and vLLM; else the first with CUDA torch; else the first with torch.
py=""; py_cuda=""; py_torch=""
for cand in "${EKKA_PYTHON:-}" "$root/.venv/bin/python" "$(command -v python3 || true)"; do
  [ -n "$cand" ] && [ -x "$cand" ] || continue
  if cuda_ok "$cand"; then
    has "$cand" vllm && { py="$cand"; break; }
    [ -n "$py_cuda" ] || py_cuda="$cand"
  fi
  [ -n "$py_torch" ] || ! has "$cand" torch || py_torch="$cand"
done
[ -n "$py" ] || py="${py_cuda:-${py_torch:-$(command -v python3 || echo python3)}}"
say "python: $py ($("$py" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available())' 2>&1 | tail -1))"

# --- 1. installs -------------------------------------------------------------------------------------------------
install_deadline=$(( SECONDS + ${EKKA_GPU_CHECK_INSTALL_BUDGET:-300} ))
pip_from_wheels() {  # PY PKG...: from the carried wheels only
  local p="$1"; shift
  [ -d "$wheels" ] && ls "$wheels"/*.whl >/dev/null 2>&1 || return 1
  "$p" -m pip install -q --disable-pip-version-check --no-index --find-links "$wheels" "$@"
}

if [ "$gpu_ok" -eq 0 ]; then
  record install-vllm FAIL 0.0 "no GPU: not installing the CUDA build (vLLM here: $("$py" -c 'import vllm; print(vllm.__version__)' 2>/dev/null || echo none))"
elif has "$py" vllm && cuda_ok "$py"; then
  record install-vllm PASS 0.0 "vLLM $("$py" -c 'import vllm; print(vllm.__version__)' 2>/dev/null) already there"
else
  t0="$(now)"
  if pip_from_wheels "$py" vllm > "$out/install-vllm.log" 2>&1 && has "$py" vllm; then
    record install-vllm PASS "$(elapsed "$t0")" "from $wheels"
  else
    run_step install-vllm-setup 280 "$install_deadline" env EKKA_VLLM=cuda bash scripts/setup.sh
    # setup.sh builds the Python half first; its node half may fail on a machine without npm: judge by imports.
    if [ -x "$root/.venv/bin/python" ] && has "$root/.venv/bin/python" vllm && cuda_ok "$root/.venv/bin/python"; then
      py="$root/.venv/bin/python"
      record install-vllm PASS "$step_s" "scripts/setup.sh (EKKA_VLLM=cuda) → $py"
    else
      record install-vllm FAIL "$step_s" "no wheels/vllm-*.whl and setup.sh did not give a CUDA vLLM (exit $step_rc): $(log_tail install-vllm-setup)"
    fi
  fi
fi

# Ekka itself: its light dependencies, and the vllm.general_plugins entry point (bug injection and tracing live in
# Ekka's vLLM plugin). Installed (editable) → as is; otherwise the engine bundle of ekka_core.remote.bundle,
# extracted and put on PYTHONPATH: its dist-info carries the entry point — no pip needed.
light="safetensors ruptures libcst rich numpy tokenizers transformers"
missing=""
for m in $light; do has "$py" "$m" || missing="$missing $m"; done
t0="$(now)"
if [ -n "$missing" ]; then
  # shellcheck disable=SC2086
  { pip_from_wheels "$py" $missing || "$py" -m pip install -q --disable-pip-version-check $missing; } \
    > "$out/install-ekka-deps.log" 2>&1
fi
missing=""
for m in $light; do has "$py" "$m" || missing="$missing $m"; done
if ! "$py" -c 'from importlib.metadata import entry_points as e; import sys
sys.exit(0 if any(x.name == "ekka" for x in e(group="vllm.general_plugins")) else 1)' >/dev/null 2>&1; then
  rm -rf "$out/ekka-engine"
  PYTHONPATH="$root" "$py" -c 'import sys, tempfile
from ekka_core.remote.bundle import build_bundle, extract_bundle
with tempfile.NamedTemporaryFile(suffix=".tar.xz") as f:
    f.write(build_bundle().data); f.flush(); extract_bundle(f.name, sys.argv[1])' "$out/ekka-engine" >> "$out/install-ekka-deps.log" 2>&1
  export PYTHONPATH="$out/ekka-engine${PYTHONPATH:+:$PYTHONPATH}"
fi
if [ -z "$missing" ] && "$py" -c 'import ekka_core.pipeline' >> "$out/install-ekka-deps.log" 2>&1; then
  record install-ekka PASS "$(elapsed "$t0")" "ekka_core from $("$py" -c 'import ekka_core; print(ekka_core.__file__)' 2>/dev/null)"
else
  record install-ekka FAIL "$(elapsed "$t0")" "missing:${missing:- none}; $(log_tail install-ekka-deps)"
fi

# SGLang in its own venv layered over the chosen Python's packages (torch, transformers, Ekka): a site-packages
# hook makes them visible, and whatever SGLang pins differently lands in the venv, in front, never in $py's env.
sg_venv="${EKKA_SGLANG_VENV:-$root/.ekka-cache/venv-sglang}"
sg_py="$py"
if [ "$gpu_ok" -eq 0 ]; then
  record install-sglang FAIL 0.0 "no GPU: SGLang ships CUDA-only wheels; not installing"
elif has "$py" sglang; then
  record install-sglang PASS 0.0 "SGLang $("$py" -c 'import sglang; print(sglang.__version__)' 2>/dev/null) already there"
else
  t0="$(now)"
  if [ ! -x "$sg_venv/bin/python" ]; then
    "$py" -m venv "$sg_venv" > "$out/install-sglang.log" 2>&1
    sg_site="$("$sg_venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null)"
    "$py" -c 'import site, sysconfig, sys
paths = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]] + site.getsitepackages())
print("import site; " + "; ".join(f"site.addsitedir({p!r})" for p in paths))' > "$sg_site/_ekka_parent_env.pth" 2>>"$out/install-sglang.log"
  fi
  sg_py="$sg_venv/bin/python"
  if ! has "$sg_py" sglang; then
    pip_from_wheels "$sg_py" sglang >> "$out/install-sglang.log" 2>&1 \
      || run_step install-sglang-pip 240 "$install_deadline" "$sg_py" -m pip install -q --disable-pip-version-check sglang
  fi
  if has "$sg_py" sglang; then
    record install-sglang PASS "$(elapsed "$t0")" "SGLang $("$sg_py" -c 'import sglang; print(sglang.__version__)' 2>/dev/null) in $sg_venv"
  else
    record install-sglang FAIL "$(elapsed "$t0")" "not from $wheels, not from pip: $(log_tail install-sglang-pip 2)"
  fi
fi

# --- 2. vLLM (CUDA) diagnoses -----------------------------------------------------------------------------------
deadline=$(( SECONDS + ${EKKA_GPU_CHECK_BUDGET:-420} ))
bug=gemma3-sliding-window-every-layer
# Spec files: the bug's zoo model for vLLM, a tiny zoo Llama for SGLang; each engine takes a quarter of the GPU's
# memory (SGLang's default is most of it).
run_step zoo 90 "$deadline" "$py" - "$out" "$bug" <<'EOF'
import sys
from pathlib import Path
from ekka_core import bugs
from ekka_core.zoo import build_model
out, name = Path(sys.argv[1]), sys.argv[2]
bug = bugs.get(name)
model = build_model(bug.arch, overrides=bug.zoo_overrides or None)
prompts = bug.prompts or bugs.DEFAULT_PROMPTS
toml = lambda s: '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
llama = build_model("llama")
for target, path, m, memory in (("vllm", out / "vllm.toml", model, "gpu_memory_utilization"),
                                ("sglang", out / "sglang.toml", llama, "mem_fraction_static")):
    path.write_text(f'model = {toml(str(m))}\ntarget = "{target}"\ndtype = "{bug.dtype}"\nmax_new_tokens = 4\n'
                    f'prompts = [{", ".join(toml(p) for p in prompts)}]\n\n[engine_args]\n{memory} = 0.25\n')
(out / "llama.path").write_text(str(llama))
print(model)
EOF
if [ "$step_rc" -eq 0 ]; then record zoo PASS "$step_s" "$(log_tail zoo 1)"; else record zoo FAIL "$step_s" "$(log_tail zoo)"; fi

verdict() {  # OUTDIR → "verdict rank1-module ratio onset" from report.json
  "$py" -c 'import json, sys
r = json.load(open(sys.argv[1] + "/report.json"))
s = (r.get("suspects") or [{}])[0]
t = s.get("target", {})
print(r["verdict"], t.get("module", "-"), s.get("error_ratio", "-"), "onset", s.get("onset_token", "-"),
      "|", r["meta"]["target"].get("framework"), r["meta"]["target"].get("version"), "| reused", r["meta"].get("reused_traces"), "|", r["meta"].get("seconds"), "s")' "$1" 2>/dev/null || echo "no report"
}

run_step vllm-bug 200 "$deadline" "$py" -m ekka_core.cli diagnose --spec "$out/vllm.toml" --out "$out/vllm-bug" --fresh --inject-bug "$bug"
v="$(verdict "$out/vllm-bug")"
case "$v" in
  "divergent model.layers.3.self_attn.attn "*) record vllm-bug-injected PASS "$step_s" "$v" ;;
  *) record vllm-bug-injected FAIL "$step_s" "exit $step_rc, want divergent at model.layers.3.self_attn.attn; got: $v; $(log_tail vllm-bug)" ;;
esac

run_step vllm-clean 200 "$deadline" "$py" -m ekka_core.cli diagnose --spec "$out/vllm.toml" --out "$out/vllm-clean" --fresh
v="$(verdict "$out/vllm-clean")"
case "$v" in
  consistent*) record vllm-clean PASS "$step_s" "$v" ;;
  *) record vllm-clean FAIL "$step_s" "exit $step_rc, want consistent; got: $v; $(log_tail vllm-clean)" ;;
esac

# --- 3. SGLang ----------------------------------------------------------------------------------------------------
# Through Ekka: the target traced inside SGLang's scheduler process (ekka_core/capture/sglang_tracing.py), the
# reference teacher-forced on its tokens, the whole diagnosis. Two verdicts: the capture (the SGLang trace is
# complete, names SGLang, and traces every fed token exactly once) and the diagnosis (consistent on a clean model).
run_step sglang-ekka 240 "$deadline" env PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" "$sg_py" -m ekka_core.cli diagnose --spec "$out/sglang.toml" --out "$out/sglang-ekka" --fresh
sglang_ekka_rc="$step_rc"; sglang_ekka_s="$step_s"
trace_check="$(PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" "$sg_py" -c 'import sys
from ekka_core.capture.trace import Trace
t = Trace(sys.argv[1]); r = t.run
seen = sorted((s, p) for st in t.steps for s, p in zip(st.seq, st.pos))
want = sorted((s, p) for s, ids in enumerate(r.token_ids) for p in range(len(ids)))
modules = {c.module for c in t.calls}
print(r.framework, r.framework_version, "complete" if r.complete else f"INCOMPLETE ({r.failure})", "|",
      len(t.steps), "steps", [s.phase for s in t.steps][:3], len(t.calls), "calls |",
      "rows-ok" if seen == want else f"rows-WRONG ({len(seen)} traced, {len(want)} fed)", "|",
      "root+logits" if {"", "logits_processor"} <= modules else "MISSING root/logits_processor")' "$out/sglang-ekka/traces/target" 2>&1 | tail -1 | cut -c1-300)"
case "$trace_check" in
  "sglang "*" complete | "*"| rows-ok | root+logits") record sglang-trace PASS "$sglang_ekka_s" "$trace_check" ;;
  *) record sglang-trace FAIL "$sglang_ekka_s" "exit $sglang_ekka_rc; ${trace_check:-no trace}; $(grep -h 'ekka: error' "$out/sglang-ekka.log" | tail -1 | cut -c1-200) $(log_tail sglang-ekka 2)" ;;
esac
v="$(verdict "$out/sglang-ekka")"
case "$v" in
  consistent*) record sglang-diagnosis PASS 0.0 "$v" ;;
  *) record sglang-diagnosis FAIL 0.0 "exit $sglang_ekka_rc, want consistent on the clean zoo Llama; got: $v" ;;
esac

# SGLang's own engine: greedy tokens on the zoo Llama, then HF Transformers' greedy tokens for the same prompts.
# (A file with a main guard: SGLang starts its scheduler processes with multiprocessing's spawn.)
cat > "$out/sglang_smoke.py" <<'EOF'
import sys, time


def main(model: str) -> None:
    prompts = ["Once upon a time there was a small model that learned to count.", "The capital of France is"]
    t = time.perf_counter()
    import sglang as sgl
    engine = sgl.Engine(model_path=model, dtype="bfloat16", disable_cuda_graph=True, mem_fraction_static=0.25,
                        random_seed=0, log_level="error")
    outs = engine.generate(prompts, {"temperature": 0.0, "max_new_tokens": 8, "ignore_eos": True})
    engine.shutdown()
    sg = [o["output_ids"] if "output_ids" in o else None for o in outs]
    print(f"sglang {sgl.__version__}: {time.perf_counter() - t:.1f} s; texts {[o['text'] for o in outs]}")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model)
    hf = AutoModelForCausalLM.from_pretrained(model, torch_dtype=torch.bfloat16, attn_implementation="eager").cuda()
    same = 0
    for i, p in enumerate(prompts):
        ids = tok(p, return_tensors="pt").input_ids.cuda()
        gen = hf.generate(ids, max_new_tokens=8, do_sample=False, min_new_tokens=8)[0, ids.shape[1]:].tolist()
        if sg[i] is None:
            sg_ids = tok(outs[i]["text"], add_special_tokens=False).input_ids[:8]
        else:
            sg_ids = list(sg[i])[:8]
        agree = sum(a == b for a, b in zip(gen, sg_ids))
        same += agree == len(gen)
        print(f"prompt {i}: HF {gen} SGLang {sg_ids} ({agree}/8 equal)")
    print(f"SMOKE OK: generated {len(outs)} sequences; {same}/{len(prompts)} identical to HF greedy (bf16, random weights: "
          "near-ties may flip a token)")


if __name__ == "__main__":
    main(sys.argv[1])
EOF
run_step sglang-generate 200 "$deadline" "$sg_py" "$out/sglang_smoke.py" "$(cat "$out/llama.path" 2>/dev/null)"
if [ "$step_rc" -eq 0 ] && grep -q "SMOKE OK" "$out/sglang-generate.log"; then
  record sglang-generate PASS "$step_s" "$(grep -h 'SMOKE OK\|^sglang ' "$out/sglang-generate.log" | tr '\n' ' ' | cut -c1-300)"
else
  record sglang-generate FAIL "$step_s" "exit $step_rc: $(log_tail sglang-generate)"
fi

# --- summary ------------------------------------------------------------------------------------------------------
echo
say "summary (logs and reports in $out):"
fails=0
for i in "${!names[@]}"; do
  printf '  %-4s %-20s %7ss  %s\n' "${statuses[$i]}" "${names[$i]}" "${times[$i]}" "${notes[$i]}" | cut -c1-220
  [ "${statuses[$i]}" = PASS ] || fails=$((fails + 1))
done
say "total ${SECONDS}s; $fails step(s) failed"
[ "$fails" -eq 0 ]
