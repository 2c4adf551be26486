"""The production setting the notebooks name: for each pinned stack, the smallest inf2 instance and ``tp_degree`` on
which a model loads, compiles and runs, counting the host's memory as well as each NeuronCore's.

Three checks, in this order, for each instance (smallest host first) and each tp degree it runs:

1. Host memory (``host_memory_estimate``): the instance's host memory (``memory.InstanceType.host_memory_gib``, from
   the Neuron architecture pages) must hold ``HOST_FACTOR`` times the checkpoint's bytes. **This is an estimate, not
   a measurement or a documented rule.** What it rests on: three reports by one user of Llama-3.1-8B-Instruct
   (about 16 GB in bf16) killed while compiling with NxD Inference on a trn1.2xlarge, whose host has 32 GiB, twice
   the checkpoint (https://github.com/aws-neuron/aws-neuron-sdk/issues/1222,
   https://github.com/aws-neuron/neuronx-distributed-inference/issues/26,
   https://github.com/aws-neuron/neuronx-distributed/issues/53): so twice the checkpoint is not enough. On the other
   side, Hugging Face's Llama-2-7B on Inferentia2 post (https://huggingface.co/blog/inferentia-llama2) names the
   inf2.8xlarge (128 GiB, about nine times a 7B checkpoint) as having "enough cpu memory to load the model". A
   factor of 3 (the checkpoint as read, a converted or sharded copy of it, and room for the compiler's processes)
   lies between the two; no source gives the number, and it is not checked on hardware here.
2. NxD Inference 0.8 only: ``tp_degree`` at least the model's ``num_key_value_heads``. aws-neuron-sdk#1289
   (https://github.com/aws-neuron/aws-neuron-sdk/issues/1289, open) reports GQA with a tp degree below the KV head
   count failing to compile with NxD Inference 0.8 on inf2.
3. Device memory: weights + KV cache per NeuronCore within what a core can use (``memory.plan(...).fits``, the
   planner with its runtime reserve).

The setting is batch 1, sequence length 4096, bf16 by default, with the buckets each stack compiles by default for
that length (transformers-neuronx: ``n_positions`` as an int gives powers of two from 128, then itself; NxD
Inference: ``generate_buckets(128, seq_len)``). ``recipe_comment(stack)`` writes it as the two comment lines every
notebook's first recipe cell of that stack carries in its ``# EDIT`` block.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .buckets import nxdi_generate_buckets, tnx_token_buckets
from .dtypes import amp_bytes, amp_torch_name
from .memory import GB, GiB, INSTANCES, Plan, Shape, instance, load_model_config, plan

HOST_FACTOR = 3  # host memory for load + compile, in checkpoints: an estimate (see the module docstring)
STACKS = ("tnx", "nxdi")
STACK_NAMES = {"tnx": "transformers-neuronx 0.13", "nxdi": "NxD Inference 0.8"}
ISSUES = {"host": "aws-neuron-sdk#1222", "kv_heads": "aws-neuron-sdk#1289"}
# What #1222 (and NxDI#26, neuronx-distributed#53) report: the host an 8B compile was killed on (a trn1.2xlarge).
HOST_EVIDENCE = "a 32 GiB trn1.2xlarge"

# The comment lines, per stack, filled from the computed setting (the line break is part of the text).
_COMMENT = {
    "tnx": ('# production: {checkpoint} in {amp} (amp="{amp}", n_positions={seq_len}, batch_size={batch_size}) at '
            'tp_degree={tp_degree} on {a_instance}\n# {instance} ({reason})'),
    "nxdi": ('# production: {checkpoint} in {amp} (torch_dtype="{torch_dtype}", seq_len={seq_len}, '
             'batch_size={batch_size}) at tp_degree={tp_degree}\n# on {a_instance} {instance} ({reason})'),
}


def _a(word: str) -> str:
    return "an" if word[:1].lower() in "aeio" or word[:1] == "8" or word[:2] == "11" or word[:2] == "18" else "a"


def checkpoint_bytes(model, amp: str = "bf16") -> int:
    """The checkpoint's bytes in ``amp`` (parameters x bytes per element; the tied embedding counted once)."""
    return Shape.from_config(load_model_config(model)).params * amp_bytes(amp)


def host_memory_estimate(model, amp: str = "bf16") -> int:
    """Host bytes loading and compiling ``model`` is estimated to need: ``HOST_FACTOR`` x the checkpoint (an
    estimate; what it rests on is in the module docstring)."""
    return HOST_FACTOR * checkpoint_bytes(model, amp)


def size_label(model) -> str:
    """'8B' for Llama-3.1-8B: the parameter count rounded to billions."""
    return f"{round(Shape.from_config(load_model_config(model)).params / 1e9)}B"


def default_buckets(stack: str, seq_len: int) -> list[int]:
    """The buckets each stack compiles by default for ``seq_len``: transformers-neuronx's token buckets for
    ``n_positions=seq_len``, NxD Inference's ``generate_buckets(128, seq_len)``."""
    if stack == "tnx":
        return tnx_token_buckets(seq_len)
    if stack == "nxdi":
        return nxdi_generate_buckets(128, seq_len)
    raise ValueError(f"stack={stack!r}: use one of {STACKS}")


@dataclass(frozen=True)
class Refusal:
    instance: str
    tp_degree: int
    rule: str    # "host" | "kv_heads" | "device"
    reason: str  # one line, for the recipe comment


def refusal(stack: str, model, inst, tp_degree: int, batch_size: int = 1, seq_len: int = 4096,
            amp: str = "bf16") -> Refusal | None:
    """Why ``model`` cannot run at ``tp_degree`` on ``inst`` with ``stack`` (the module's three checks, in order),
    or None when it can."""
    it, tp = instance(inst), int(tp_degree)
    s = Shape.from_config(load_model_config(model))
    size = size_label(model)
    if tp not in it.tp_degrees:
        return Refusal(it.name, tp, "device", f"{it.name} does not run tp_degree={tp} (it runs {it.tp_degrees})")
    if host_memory_estimate(model, amp) > it.host_memory_bytes:
        return Refusal(it.name, tp, "host", f"not {_a(it.name)} {it.name}, {it.host_memory_gib} GiB host: {_a(size)} "
                                            f"{size} compile ran out of {HOST_EVIDENCE} in {ISSUES['host']}")
    if stack == "nxdi" and tp < s.kv_heads:
        return Refusal(it.name, tp, "kv_heads", f"{STACK_NAMES['nxdi']} is reported not to compile {s.kv_heads} KV "
                                                f"heads over {tp} core{'s' * (tp != 1)}: {ISSUES['kv_heads']}")
    p = plan(model, tp, batch_size=batch_size, n_positions=seq_len, amp=amp, library=stack)
    if not p.fits(it):
        return Refusal(it.name, tp, "device", p.error or f"{p.total_bytes / GiB:.2f} GiB per NeuronCore at "
                       f"tp_degree={tp} exceed the {p.usable_bytes(it) / GiB:.2f} GiB usable of {_a(it.name)} "
                       f"{it.name} core")
    return None


@dataclass(frozen=True)
class Setting:
    stack: str
    model: str           # the shipped config it was sized from
    checkpoint: str      # the checkpoint the notebooks name (same shape)
    instance: str
    tp_degree: int
    batch_size: int
    seq_len: int
    amp: str
    buckets: tuple
    host_estimate_bytes: int
    plan: Plan
    refused: tuple = field(default_factory=tuple)  # the Refusals of every smaller candidate, in order

    @property
    def reason(self) -> Refusal:
        """Why the next smaller instance was refused (at the largest tp degree it runs)."""
        smaller = [r for r in self.refused if r.instance != self.instance]
        return smaller[-1] if smaller else self.refused[-1]

    def row(self) -> dict:
        it = INSTANCES[self.instance]
        return {"stack": STACK_NAMES[self.stack], "model": self.checkpoint, "instance": self.instance,
                "tp_degree": self.tp_degree, "batch_size": self.batch_size, "sequence length": self.seq_len,
                "dtype": self.amp, "buckets": ", ".join(map(str, self.buckets)),
                "GiB per core (weights + KV)": round(self.plan.total_bytes / GiB, 2),
                "host GiB (estimate / instance)": f"{self.host_estimate_bytes / GiB:.0f} / {it.host_memory_gib}",
                "smaller instance refused": self.reason.reason}


def production_setting(stack: str, model="Llama-3.1-8B", checkpoint: str = "Llama-3.1-8B-Instruct",
                       batch_size: int = 1, seq_len: int = 4096, amp: str = "bf16", platform: str = "inf2") -> Setting:
    """The smallest ``platform`` instance (by host memory) and, on it, the smallest tp degree the runtime runs that
    passes the module's three checks for ``stack``. ``checkpoint``: the name the notebooks print (the Instruct model
    has the base model's config). Raises ValueError when no instance of the platform holds the model."""
    if stack not in STACKS:
        raise ValueError(f"stack={stack!r}: use one of {STACKS}")
    candidates = sorted((i for i in INSTANCES.values() if i.platform == platform),
                        key=lambda i: (i.host_memory_gib, i.cores))
    refused = []
    for it in candidates:
        for tp in it.tp_degrees:
            why = refusal(stack, model, it, tp, batch_size, seq_len, amp)
            if why is None:
                return Setting(stack, Shape.from_config(load_model_config(model)).name, checkpoint, it.name, tp,
                               batch_size, seq_len, amp, tuple(default_buckets(stack, seq_len)),
                               host_memory_estimate(model, amp),
                               plan(model, tp, batch_size=batch_size, n_positions=seq_len, amp=amp, library=stack),
                               tuple(refused))
            refused.append(why)
    raise ValueError(f"no {platform} instance holds {model} for {stack}: " + "; ".join(r.reason for r in refused[-2:]))


def recipe_comment(stack: str, setting: Setting | None = None) -> str:
    """The two comment lines of the production setting in the ``# EDIT`` block of a stack's first recipe cell,
    filled from :func:`production_setting` (the same in every notebook)."""
    s = setting or production_setting(stack)
    return _COMMENT[stack].format(checkpoint=s.checkpoint, amp=s.amp, torch_dtype=amp_torch_name(s.amp),
                                  seq_len=s.seq_len, batch_size=s.batch_size, tp_degree=s.tp_degree,
                                  a_instance=_a(s.instance), instance=s.instance, reason=s.reason.reason)


def production_table(stacks=STACKS) -> list[dict]:
    """One row per stack: the setting and why the smaller instance was refused (docs/inf2.md shows this table)."""
    return [production_setting(s).row() for s in stacks]


def production_markdown(stacks=STACKS) -> str:
    """:func:`production_table` as a Markdown table (docs/inf2.md carries it verbatim; a test compares)."""
    rows = production_table(stacks)
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "| " + " | ".join("---" for _ in cols) + " |"]
    lines += ["| " + " | ".join(str(r[c]).replace("|", "\\|") for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def smallest_tp_rows(models, stacks=STACKS, batch_size: int = 1, seq_len: int = 4096, amp: str = "bf16",
                     instances=None) -> list[dict]:
    """Per model and stack, per instance: the smallest tp degree that passes the module's three checks, or the rule
    that refused its largest degree ("host memory", "#1289", "device memory"). Host memory counted, not only the
    NeuronCores' (``memory.smallest_fitting_tp`` counts those alone)."""
    names = {"host": "host memory", "kv_heads": "#1289", "device": "device memory"}
    rows = []
    for m in models:
        for stack in stacks:
            row = {"model": Shape.from_config(load_model_config(m)).name, "stack": stack}
            for it in [instance(i) for i in (instances or INSTANCES)]:
                why = None
                for tp in it.tp_degrees:
                    why = refusal(stack, m, it, tp, batch_size, seq_len, amp)
                    if why is None:
                        row[it.name] = tp
                        break
                else:
                    row[it.name] = names[why.rule]
            rows.append(row)
    return rows


def host_memory_rows(model="Llama-3.1-8B", amp: str = "bf16", platform: str = "inf2") -> list[dict]:
    """Per instance of ``platform``: its host memory against the load-and-compile estimate for ``model``."""
    need = host_memory_estimate(model, amp)
    return [{"instance": i.name, "host GiB": i.host_memory_gib, "NeuronCores": i.cores,
             "checkpoint GB": round(checkpoint_bytes(model, amp) / GB, 1),
             f"estimate GiB ({HOST_FACTOR}x)": round(need / GiB, 1), "holds it": need <= i.host_memory_bytes}
            for i in INSTANCES.values() if i.platform == platform]


if __name__ == "__main__":  # python -m helpers.planning.production: the table and lines docs/inf2.md carries
    print(production_markdown())
    for _stack in STACKS:
        print(f"\n{STACK_NAMES[_stack]}:\n{recipe_comment(_stack)}")
