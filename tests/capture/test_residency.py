"""The reference holds only what it computes with (:mod:`ekka_core.capture.residency`), and computes exactly what
``from_pretrained(dtype=…)`` computes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from ekka_core.capture.hf_runner import load_model
from ekka_core.capture.residency import letting_go_while_loading, release_after_forward, stored_float_dtype

IDS = torch.tensor([[5, 17, 3, 99, 42, 7, 1, 300, 12, 64]])


def _mapped_rss_kb(path: Path) -> int:
    """This process's resident kB of its mappings of ``path`` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
            inside = line.rstrip().endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


def test_the_stored_dtype_is_read_from_the_safetensors_headers(zoo_model, tmp_path):
    assert stored_float_dtype(str(zoo_model("llama"))) == torch.float32          # the zoo saves fp32
    save_file({"w": torch.zeros(64, dtype=torch.bfloat16), "ids": torch.zeros(4, dtype=torch.int64)},
              tmp_path / "model.safetensors")
    assert stored_float_dtype(str(tmp_path)) == torch.bfloat16
    assert stored_float_dtype(str(tmp_path / "missing")) is None


def test_released_weights_compute_the_same_and_leave_the_mapping(zoo_model, monkeypatch):
    """fp32 from an fp32 checkpoint: the weights are views of the mapped file; let go after each module's forward,
    the logits are bit for bit those of a model that kept them, and the file's pages are no longer resident."""
    from ekka_core.capture import hf_runner

    model_dir = zoo_model("llama", hidden_size=512, intermediate_size=2048)
    released = load_model(str(model_dir), torch.float32)
    with monkeypatch.context() as m:          # the same load without letting go: a model that keeps its pages
        m.setattr(hf_runner, "release_after_forward", lambda model: 0)
        kept = load_model(str(model_dir), torch.float32)
    checkpoint = next(model_dir.glob("*.safetensors"))
    with torch.no_grad():
        want = kept(input_ids=IDS).logits
        before = _mapped_rss_kb(checkpoint)
        got = released(input_ids=IDS).logits
    assert torch.equal(got, want)
    size_kb = checkpoint.stat().st_size // 1024
    assert before >= 0.9 * size_kb                       # the model that kept its weights holds the whole file
    assert _mapped_rss_kb(checkpoint) - before < 0.1 * size_kb    # the released one added almost nothing


def test_a_page_written_since_it_was_mapped_is_never_let_go(zoo_model):
    """A weight something wrote into is private memory: letting its pages go would bring back the file's values."""
    model_dir = zoo_model("llama")
    model = load_model(str(model_dir), torch.float32)
    weight = model.model.layers[0].mlp.down_proj.weight
    with torch.no_grad():
        weight.add_(1.0)                                 # copy-on-write: these pages are the process's now
        written = weight.clone()
        model(input_ids=IDS)
    assert torch.equal(weight, written)


def test_no_file_mapping_nothing_hooked():
    assert release_after_forward(torch.nn.Linear(4, 4)) == 0


def test_a_mapped_checkpoint_is_let_go_but_never_what_was_written_into_it(tmp_path):
    """What :func:`letting_go_while_loading` does every interval: the file's pages leave this process (the page cache
    keeps them: reading again gives the same bytes), except a page the process wrote into a private mapping."""
    import mmap

    from ekka_core.capture.residency import _PAGES

    path = tmp_path / "model.safetensors"
    path.write_bytes(bytes(range(256)) * (64 << 10))                # 16 MB
    with open(path, "rb") as f:
        shared = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        private = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    first = bytes(shared[:256])
    for i in range(0, len(shared), 4096):                            # every page read: resident
        shared[i]
    assert _mapped_rss_kb(path) >= 16 << 10
    _PAGES.release_mappings({str(path)})
    assert _mapped_rss_kb(path) < 1 << 10 and bytes(shared[:256]) == first
    private[5] = 77                                                  # copy-on-write: that page is the process's
    _PAGES.release_mappings({str(path)})
    assert private[5] == 77
    shared.close()
    private.close()


def test_letting_go_while_loading_loads_the_same_weights(zoo_model):
    """bf16 from an fp32 checkpoint, its pages let go as the load goes on (continuously here): the same weights."""
    from transformers import AutoModelForCausalLM

    model_dir = str(zoo_model("llama"))
    plain = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    with letting_go_while_loading(model_dir, every=0.0):
        lean = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    a, b = plain.state_dict(), lean.state_dict()
    assert a.keys() == b.keys()
    assert all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_load_model_is_from_pretrained(zoo_model, dtype):
    """What the reference runs is from_pretrained's model whatever the residency: the same logits."""
    from transformers import AutoModelForCausalLM

    model_dir = str(zoo_model("llama"))
    plain = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="eager").eval()
    with torch.no_grad():
        got = load_model(model_dir, dtype)(input_ids=IDS).logits
        assert torch.equal(got, plain(input_ids=IDS).logits)


@pytest.mark.slow
def test_an_engine_that_lets_go_while_loading_computes_the_same(zoo_model, tmp_path):
    """Ekka's traced runs let go of the checkpoint's pages as vLLM loads it (the plugin's EKKA_LET_GO_WHILE_LOADING):
    the same tokens and logprobs, to the bit, as an engine that keeps them."""
    from ekka_core.capture import run_engine
    from ekka_core.capture.vllm_config import configuration, served_args
    from ekka_core.capture.vllm_plugin import LET_GO_WHILE_LOADING_ENV
    from ekka_core.contracts.spec import DiagnosisSpec

    spec = DiagnosisSpec(model=str(zoo_model("llama")), prompts=["The capital of France is"], dtype="bfloat16",
                         max_new_tokens=4)
    args, _ = configuration(served_args(spec)[0], None)
    kept = run_engine(spec, tmp_path / "kept", args, label="kept", score=False)
    # letting go continuously (every 0 s): a tiny checkpoint loads within one interval of 0.1 s
    lean = run_engine(spec, tmp_path / "lean", args, label="lean", score=False, env={LET_GO_WHILE_LOADING_ENV: "0"})
    assert [(r.generated, r.logprobs) for r in lean.outputs.requests] == \
        [(r.generated, r.logprobs) for r in kept.outputs.requests]


def test_a_forked_process_reads_its_own_page_map(tmp_path):
    """The warm run host imports this module and then forks a child per run: the child must guard its writes with
    its own page map, not the host's (a page map opened by the host describes the host's memory)."""
    import mmap
    import os

    from ekka_core.capture.residency import _PAGES

    assert _PAGES.available
    _PAGES.release_mappings(set())                       # the parent has used its page map before the fork
    path = tmp_path / "model.safetensors"
    path.write_bytes(bytes(range(256)) * (16 << 10))    # 4 MB
    pid = os.fork()
    if pid == 0:                                         # the child: a run forked from the host
        ok = False
        try:
            with open(path, "rb") as f:
                private = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
            private[5] = 77                              # copy-on-write: that page is this process's
            _PAGES.release_mappings({str(path)})
            ok = private[5] == 77
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child's written page was let go"
