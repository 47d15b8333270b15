"""What a launch script adds for a layout beyond tensor parallelism (pipeline/config/layout.py):
speculative decoding in each engine's own form, and for a disaggregated deployment each pool's
role arguments and the router that joins the pools. The names come from the engines' tables
(pipeline/deploy/flags.py); what an engine cannot express comes back as a comment.

Ports: the router listens on 8000; a pool's servers take PORT (prefill 8100, 8101, ...;
decode 8200, 8201, ...), all on localhost until the hosts are edited.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pipeline.deploy.flags import Disagg, Flag, Kind, Speculative
from pipeline.disagg.routing import policy_error

if TYPE_CHECKING:
    from pipeline.deploy.settings import Deployment

ROUTER_PORT = 8000
FIRST_PORT = {"prefill": 8100, "decode": 8200}


class Raw(str):
    """An argument already written for the shell (it expands a variable): not quoted again."""

    __slots__ = ()


def shell_args(args: Sequence[str]) -> list[str]:
    return [a if isinstance(a, Raw) else shlex.quote(a) for a in args]


@dataclass
class Extra:
    """What a layout adds to one script."""

    args: list[str] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)  # the engine's options file
    setup: list[str] = field(default_factory=list)  # lines before the command
    comments: list[str] = field(default_factory=list)


def _json_arg(value: dict[str, Any]) -> str:
    """A JSON argument; double-quoted where it expands a variable, else single-quoted."""
    text = json.dumps(value)
    if "$" not in text:
        return text
    return Raw('"' + text.replace('"', '\\"') + '"')


def _needs(variable: str, what: str) -> str:
    return f': "${{{variable}:?set {variable} to {what}}}"'


def speculative(spec: Speculative | None, d: Deployment, engine: str) -> Extra:
    """The engine's speculative-decoding arguments for speculative.method/tokens."""
    out = Extra()
    method = d.layout.speculative
    if method == "none":
        return out
    name = spec.methods.get(method) if spec else None
    if spec is None or name is None:
        why = spec.notes.get(method, "no such method") if spec else "no speculative decoding"
        out.comments.append(f"speculative.method={method}: not set: {engine}: {why}.")
        return out
    if spec.style == "sglang" and method == "ngram" and d.layout.dp > 1:
        out.comments.append(f"speculative.method=ngram with dp={d.layout.dp}: not set: "
                            f"{spec.notes['ngram_dp']}.")  # fmt: skip
        return out
    out.comments += _caveats(spec, d, method)
    if spec.caveat:
        out.comments.append(f"{spec.caveat}.")
    variable = spec.model_env.get(method, "")
    if variable:
        model = d.layout.draft_model or "the model's MTP weights"
        out.setup.append(_needs(variable, f"the folder or id of {model}"))
    steps, topk, draft_tokens = _tree(d)
    if spec.style != "sglang" and (topk > 1 or draft_tokens != steps + 1):
        out.comments.append(f"speculative topk={topk}, draft_tokens={draft_tokens}: not set: "
                            f"{engine} drafts a chain of {steps}.")  # fmt: skip
    if spec.style == "json":
        config: dict[str, Any] = {"method": name, "num_speculative_tokens": steps}
        if variable:
            config["model"] = f"${variable}"
        out.args += ["--speculative-config", _json_arg(config)]
    elif spec.style == "sglang":
        out.args += ["--speculative-algorithm", name, "--speculative-num-steps", str(steps)]
        if method != "ngram":
            out.args += ["--speculative-eagle-topk", str(topk)]
        out.args += ["--speculative-num-draft-tokens", str(draft_tokens)]
        if variable:
            out.args += ["--speculative-draft-model-path", Raw(f'"${variable}"')]
    else:
        out.options["speculative_config"] = _yaml_speculative(name, steps, variable)
        if variable:
            out.comments.append(
                f"speculative_config.speculative_model_dir in the options file: replace "
                f"{variable} by the folder of {d.layout.draft_model or 'the draft model'}."
            )
    return out


def _tree(d: Deployment) -> tuple[int, int, int]:
    """Passes of the draft, branches a node, tokens a row verifies: SGLang's tree where the
    plan gives one, else the chain of speculative.tokens."""
    layout = d.layout
    if not layout.speculative_steps:
        k = layout.speculative_tokens
        return k, 1, k + 1
    steps = layout.speculative_steps
    return steps, layout.speculative_topk or 1, layout.speculative_draft_tokens or steps + 1


def _caveats(spec: Speculative, d: Deployment, method: str) -> list[str]:
    """What the engine's page says it does not yet do with these settings."""
    found = []
    most = spec.max_tokens.get(method)
    if most is not None and d.layout.speculative_tokens > most:
        found.append(f"speculative.tokens={d.layout.speculative_tokens}: its page allows at "
                     f"most {most} for {method}; set as planned.")  # fmt: skip
    parallel = d.layout.ep > 1 or d.layout.dp > 1 or d.role
    if spec.layout_note and parallel:
        found.append(f"speculative.method={method} with ep/dp or a pool: {spec.layout_note}.")
    return found


def _yaml_speculative(name: str, k: int, variable: str) -> dict[str, Any]:
    if name == "MTP":
        return {"decoding_type": name, "num_nextn_predict_layers": k}
    config: dict[str, Any] = {"decoding_type": name, "max_draft_len": k}
    if variable:
        config["speculative_model_dir"] = variable
    return config


def parallel_lines(flags: dict[str, Flag], d: Deployment) -> list[str]:
    """`--flag value` lines for dp and ep from a server's table (HPU scripts): a VALUE flag
    unless the value is its skip, a SWITCH when the count is above 1."""
    lines = []
    for key, value in (("dp", d.layout.dp), ("ep", d.layout.ep)):
        flag = flags[key]
        if flag.kind is Kind.SWITCH and value > 1:
            lines.append(flag.name)
        elif flag.kind is Kind.VALUE and value != flag.skip:
            lines.append(f"{flag.name} {value}")
    return lines


def pairs(args: Sequence[str]) -> list[str]:
    """Arguments as `--flag value` lines, each quoted for the shell."""
    quoted, out, i = shell_args(args), [], 0
    while i < len(quoted):
        value = i + 1 < len(quoted) and not quoted[i + 1].startswith("--")
        out.append(" ".join(quoted[i : i + 2]) if value else quoted[i])
        i += 2 if value else 1
    return out


def role_extra(disagg: Disagg, role: str) -> Extra:
    """A pool server's arguments: its role and PORT (the first of its pool by default)."""
    port = Raw('"$PORT"')
    args = [port if a == "{port}" else a for a in disagg.roles[role]]
    return Extra(
        args=args,
        options=dict(disagg.options.get(role, {})),
        setup=[f'PORT="${{PORT:-{FIRST_PORT[role]}}}"  # this copy\'s port: '
               f"{FIRST_PORT[role]}, {FIRST_PORT[role] + 1}, ... one a copy"],
    )  # fmt: skip


def ports(d: Deployment, role: str) -> list[int]:
    """Every server of a pool over all replicas, by port."""
    count = d.replicas * (d.layout.prefill if role == "prefill" else d.layout.decode)
    return [FIRST_PORT[role] + i for i in range(count)]


def router_command(disagg: Disagg, d: Deployment, config: str = "") -> str:
    """The router's command with every pool server listed (localhost: edit the hosts), for
    the policy the run simulated where the engine's router has it (else in turn)."""
    fill: dict[str, str] = {"config": config, "policy": d.layout.router}
    for role in ("prefill", "decode"):
        mine = ports(d, role)
        fill[f"{role}_hosts"] = " ".join("localhost" for _ in mine)
        fill[f"{role}_ports"] = " ".join(str(p) for p in mine)
        fill[f"{role}_urls"] = " ".join(f"--{role} http://localhost:{p}" for p in mine)
    policy = disagg.policies.get(d.layout.router)
    return (policy[0] if policy else disagg.router).format(**fill)


def router_script(disagg: Disagg, d: Deployment, engine: str, config: str = "") -> str:
    """The script that starts the router (or says why there is none)."""
    lines = [
        "#!/usr/bin/env bash",
        f"# {engine}, disaggregated: the router in front of {d.layout.prefill} prefill and "
        f"{d.layout.decode} decode server(s) a replica, {d.replicas} replica(s); {d.origin}.",
        f"# Names as read from: {disagg.doc}.",
        "set -euo pipefail",
    ]
    policy = d.layout.router
    note = (disagg.policies[policy][1] if policy in disagg.policies else "") or disagg.note
    if note:
        lines.append(f"# {note}.")
    error = policy_error(policy)
    if error:  # a folder edited by hand: nothing unknown reaches a script
        raise ValueError(error)
    if policy != "round_robin" and policy not in disagg.policies:
        lines.append(
            f"# The run simulated disagg.router={policy}; this router has no such policy "
            "here and sends requests in turn, so its TTFT may differ from the run's."
        )
    lines.append(f"exec {router_command(disagg, d, config)}")
    return "\n".join(lines) + "\n"


def trtllm_disagg_config(d: Deployment) -> dict[str, Any]:
    """trtllm-serve disaggregated's configuration: the router and each pool's servers."""
    servers = {}
    for role, key in (("prefill", "context_servers"), ("decode", "generation_servers")):
        mine = ports(d, role)
        servers[key] = {"num_instances": len(mine), "urls": [f"localhost:{p}" for p in mine]}
    return {"hostname": "localhost", "port": ROUTER_PORT, "backend": "pytorch", **servers}
