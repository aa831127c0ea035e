"""The recipes of docs/loading.md's "In a training framework" section run with
the real Lightning, Fabric, accelerate and transformers classes, on the CPU,
for two steps each.

The page fences them ``{.python .recipe}``: scripts/docs_examples.py does not
run them, as they need packages the torch extra does not have. Here each
recipe's block runs after the section's first block (the batch, data and model
the recipes share), as the page has them, in a fresh process: the frameworks
keep global state (accelerate's singletons, transformers' registrations with
torch.utils._pytree, Lightning's logging). In that process, before the blocks
run, ``pytree_kit.torch.to_device`` and ``collate`` are replaced by spies (the
recipes import them from there) and a global forward hook records what the
model receives. The test then asserts that:

- ``to_device`` was called once per step, on the device the framework gives,
  with the batch the DataLoader's ``collate`` made (or, in the recipe of a
  tokenizer's batches, the ``BatchEncoding`` transformers' own collator made);
- each step the model received the very dataclass object ``to_device``
  returned, not the loader's: on the CPU ``to_device`` may give back the
  loader's own tensors, so the new object it builds is what tells its output
  from its input; and every tensor in it is on that device;
- the model's parameters changed: training happened;
- the recipe raised no warning, past the filters below for framework noise.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import types
import warnings
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any, Optional

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "loading.md"
SECTION = "## In a training framework: Lightning, Fabric, accelerate, transformers"
#: the recipes stop after this many optimizer steps
STEPS = 2


@dataclass(frozen=True)
class Recipe:
    framework: str  # the module the recipe needs (skipped without it)
    model: str  # the class name of the model whose forward gets the batch
    key: Optional[str]  # the batch's dataclass: None, the whole batch (the model's first
    # argument); else the batch's item of that key (the model's keyword argument)
    dataclass: str  # the class name of that dataclass (or of the tensor the model gets)
    whole: str  # the class name of the batch to_device gets
    collate: bool = True  # whether the batch is pytree_kit.torch.collate's


#: the page's "### " headings, each with its recipe
RECIPES = {
    "Lightning": Recipe("lightning", "Regressor", None, "Batch", "Batch"),
    "Fabric": Recipe("lightning", "Regressor", None, "Batch", "Batch"),
    "accelerate": Recipe("accelerate", "Regressor", None, "Batch", "Batch"),
    "transformers Trainer": Recipe("transformers", "Classifier", "text", "Text", "dict"),
    # transformers' own collator makes the batch: a tokenizer's BatchEncoding
    "transformers Trainer, with a tokenizer's batches": Recipe(
        "transformers",
        "BertForSequenceClassification",
        "input_ids",
        "Tensor",
        "BatchEncoding",
        collate=False,
    ),
}

#: framework noise, not the recipes' doing (a warning not matched here fails the test)
NOISE = [
    # Lightning 2.6's own use of a torch.utils._pytree name torch 2.13 deprecates
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning),
    # Lightning's advice for real runs; it depends on the machine's number of CPUs
    (r"The 'train_dataloader' does not have many workers", UserWarning),
]

_BLOCK = re.compile(r"^```\{\.python \.recipe\}\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def blocks() -> dict[str, tuple[int, str]]:
    """The section's recipe blocks, ``{heading: (line of its first line, source)}``;
    the block before the first heading is "setup"."""
    text = PAGE.read_text(encoding="utf-8")
    start = text.index(f"\n{SECTION}\n") + 1
    end = text.find("\n## ", start)
    found: dict[str, tuple[int, str]] = {}
    for m in _BLOCK.finditer(text, start, end if end != -1 else len(text)):
        headings = re.findall(r"^### (.+)$", text[start : m.start()], flags=re.MULTILINE)
        name = headings[-1] if headings else "setup"
        assert name not in found, f"two recipe blocks under {name!r}"
        found[name] = (text.count("\n", 0, m.start(1)) + 1, m.group(1))
    return found


def test_the_page_has_each_recipe_and_the_setup_they_share() -> None:
    assert set(blocks()) == {"setup", *RECIPES}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(RECIPES))
def test_recipe_moves_each_batch_with_to_device_and_trains(name: str, tmp_path: Path) -> None:
    recipe = RECIPES[name]
    pytest.importorskip(recipe.framework)
    # the working directory is the recipe's (the Trainer's output_dir="runs")
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from tests.torch.test_recipes import main; main({name!r})"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])

    assert report["warnings"] == []
    # the hook ran once per step, on the framework's device, with the loader's batch
    assert report["to_device_calls"] == STEPS
    assert report["devices"] == ["cpu"] * STEPS
    given = {"type": recipe.dataclass, "whole": recipe.whole, "from_collate": recipe.collate}
    assert report["given"] == [given] * STEPS
    # the model got what to_device returned, a new object, on the device
    assert report["forward_calls"] == STEPS
    moved = {"type": recipe.dataclass, "is_to_device_output": True, "is_loader_batch": False}
    assert report["received"] == [moved] * STEPS
    assert report["tensor_devices"] == ["cpu"]
    assert report["tensors_received"] > 0
    # and trained
    assert report["params_changed"] is True


def main(name: str) -> None:
    """Run a recipe, in this process, and print what it did as one JSON line."""
    import pytree_kit.torch as pkt

    recipe = RECIPES[name]
    to_device, collate = pkt.to_device, pkt.collate
    moves: list[tuple[Any, Any, Any]] = []  # (batch, device, what came back)
    collated: list[Any] = []
    received: list[Any] = []  # the dataclass of each call of the model
    before: dict[str, Any] = {}
    model: list[Any] = []

    def pick(batch: Any) -> Any:
        return batch if recipe.key is None else batch[recipe.key]

    def spy_to_device(batch: Any, device: Any, **kwargs: Any) -> Any:
        out = to_device(batch, device, **kwargs)
        moves.append((batch, torch.device(device), out))
        return out

    def spy_collate(samples: Any, **kwargs: Any) -> Any:
        batch = collate(samples, **kwargs)
        collated.append(batch)
        return batch

    def hook(module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        if type(module).__name__ != recipe.model:
            return
        received.append(args[0] if recipe.key is None else kwargs[recipe.key])
        if not model:  # after the first forward, before the first optimizer step
            model.append(module)
            before.update({k: v.detach().clone() for k, v in module.state_dict().items()})

    pkt.to_device, pkt.collate = spy_to_device, spy_collate
    handle = torch.nn.modules.module.register_module_forward_hook(hook, with_kwargs=True)
    found = blocks()
    page = types.ModuleType("_recipe")  # a module, for the recipes' dataclasses
    page.__file__ = str(PAGE)
    sys.modules[page.__name__] = page
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for message, category in NOISE:
                warnings.filterwarnings("ignore", message, category)
            for first_line, source in (found["setup"], found[name]):
                # leading newlines: tracebacks give the line in the page
                code = compile("\n" * (first_line - 1) + source, str(PAGE), "exec")
                exec(code, page.__dict__)
    finally:
        handle.remove()
        pkt.to_device, pkt.collate = to_device, collate

    tensors = [
        getattr(data, f.name)
        for data in received
        if is_dataclass(data)
        for f in fields(data)
        if isinstance(getattr(data, f.name), torch.Tensor)
    ] + [data for data in received if isinstance(data, torch.Tensor)]
    after = model[0].state_dict() if model else {}
    report = {
        "warnings": [f"{w.category.__name__}: {w.message}" for w in caught],
        "to_device_calls": len(moves),
        "devices": [str(device) for _, device, _ in moves],
        "given": [
            {
                "type": type(pick(batch)).__name__,
                "whole": type(batch).__name__,
                "from_collate": any(pick(batch) is pick(c) for c in collated),
            }
            for batch, _, _ in moves
        ],
        "forward_calls": len(received),
        "received": [
            {
                "type": type(data).__name__,
                "is_to_device_output": i < len(moves) and data is pick(moves[i][2]),
                "is_loader_batch": any(data is pick(c) for c in collated),
            }
            for i, data in enumerate(received)
        ],
        "tensor_devices": sorted({str(t.device) for t in tensors}),
        "tensors_received": len(tensors),
        "params_changed": any(not torch.equal(before[k], after[k]) for k in before),
    }
    print(json.dumps(report))
