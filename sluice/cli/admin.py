"""`sluice admin`: manage admin objects, quotas, members, tokens, agents' certificates and clusters, and read
the audit log.

Needs an admin token. Like the rest of the CLI, it imports the client (grpc) only inside commands.
"""
from __future__ import annotations

from enum import Enum

import typer

from sluice.cli.common import Failed, OutputOpt, call, make_client, read_documents
from sluice.output import Format, emit

app = typer.Typer(no_args_is_help=True, help="Administer objects, quotas, tokens and clusters (admin token).")
quota_app = typer.Typer(no_args_is_help=True, help="Queue quotas.")
queue_app = typer.Typer(no_args_is_help=True, help="Queue membership.")
token_app = typer.Typer(no_args_is_help=True, help="API tokens.")
cert_app = typer.Typer(no_args_is_help=True, help="Agents' client certificates (mTLS): revoke one, list revoked.")
cluster_app = typer.Typer(no_args_is_help=True, help="Cordon, drain and uncordon clusters.")
app.add_typer(quota_app, name="quota")
app.add_typer(queue_app, name="queue")
app.add_typer(token_app, name="token")
app.add_typer(cert_app, name="cert")
app.add_typer(cluster_app, name="cluster")

PAST = {"create": "created", "update": "updated", "unchanged": "unchanged"}
# Spec fields shown by `admin get KIND` as a table, per kind.
TABLE_FIELDS = {"Queue": ("parent", "guaranteed", "max", "weight", "members", "serviceClasses"),
                "ServiceClass": ("priority", "preemptible", "canPreempt", "weight", "reservationAfter", "burst"),
                "Cluster": ("tier", "site", "leaseDuration", "labels"),
                "BurstPolicy": ("queues", "serviceClasses", "clusterSelector", "after", "budget")}


def _client(ctx: typer.Context, what: str):
    from sluice.admin_client import AdminClient
    return make_client(ctx, what, AdminClient)


def _kind(value: str) -> str:
    from sluice.objects import KINDS, kind_named
    kind = kind_named(value)
    if kind is None:
        raise typer.BadParameter(f"unknown kind {value!r}, known: {', '.join(sorted(KINDS))}")
    return kind


def _changed(kind: str, name: str, action: str) -> None:
    print(f"{kind}/{name}: {PAST.get(action, action)}")


@app.command()
def apply(ctx: typer.Context,
          file: str = typer.Option(..., "-f", "--file", help="Queue, ServiceClass, Cluster and BurstPolicy "
                                                             "documents (YAML/JSON); - reads stdin"),
          dry_run: bool = typer.Option(False, "--dry-run", help="Show what would change and the diff; change nothing")
          ) -> None:
    """Create or update admin objects, all or nothing."""
    from sluice.objects import load_objects
    what = f"admin apply {file}"
    objects = read_documents(what, file, lambda text: load_objects(text, source=None))
    if not objects:
        raise Failed(what, "the file holds no objects")
    client = _client(ctx, what)
    for result in call(what, lambda: client.apply(objects, dry_run=dry_run)):
        _changed(result["kind"], result["name"], result["action"])
        if dry_run and result["diff"]:
            print(result["diff"], end="")
    if dry_run:
        print("dry run: nothing was changed")


@app.command()
def get(ctx: typer.Context, kind: str = typer.Argument(..., help="queue, class, cluster or burstpolicy (any case, "
                                                                 "plural too)"),
        name: str | None = typer.Argument(None), output: Format = OutputOpt) -> None:
    """Show admin objects as stored: one, or every object of a kind."""
    canonical = _kind(kind)
    what = f"admin get {kind}" + (f" {name}" if name else "")
    client = _client(ctx, what)
    docs = call(what, lambda: client.get_objects(canonical, name or ""))
    if output != Format.table:
        emit(docs[0] if name else docs, output)
        return
    fields = TABLE_FIELDS[canonical]
    rows = [{"name": d["metadata"]["name"], **d["metadata"], **d["spec"]} for d in docs]
    for row in rows:
        row.update({k: ",".join(map(str, v)) or None for k, v in row.items() if isinstance(v, list)})
    emit(rows, output, [("NAME", "name"), *((f.upper(), f) for f in fields)])


@app.command()
def delete(ctx: typer.Context, kind: str = typer.Argument(...), name: str = typer.Argument(...)) -> None:
    """Delete an object; refused, saying why, while anything uses it."""
    canonical = _kind(kind)
    what = f"admin delete {kind} {name}"
    client = _client(ctx, what)
    call(what, lambda: client.delete(canonical, name))
    print(f"{canonical}/{name}: deleted")


def _resources(values: list[str], option: str) -> dict[str, str]:
    out = {}
    for item in values:
        resource, sep, amount = item.partition("=")
        if not sep or not resource:
            raise typer.BadParameter(f"{option} {item!r}: expected NAME=QUANTITY")
        out[resource] = amount
    return out


class ManifestFormat(str, Enum):  # noqa: UP042 - a typer option type, as sluice.output.Format
    yaml = "yaml"
    json = "json"


@app.command()
def crds(output: ManifestFormat = typer.Option(ManifestFormat.yaml, "--output", "-o",
                                               help="yaml (documents for kubectl apply -f) or json (a v1 List)")
         ) -> None:
    """Print the CustomResourceDefinitions of Queue, ServiceClass, Cluster and BurstPolicy (no dispatcher needed)."""
    from sluice import crds as definitions
    documents = definitions.crds()
    text = definitions.manifests_yaml(documents) if output == ManifestFormat.yaml else \
        definitions.manifests_json(documents)
    print(text, end="")


@quota_app.command("set")
def quota_set(ctx: typer.Context, queue: str = typer.Argument(...),
              cpu: str | None = typer.Option(None, "--cpu", help="Guaranteed cpu ('' removes it)"),
              memory: str | None = typer.Option(None, "--memory", help="Guaranteed memory"),
              gpu: str | None = typer.Option(None, "--gpu", help="Guaranteed nvidia.com/gpu"),
              resource: list[str] = typer.Option([], "--resource", help="Guaranteed NAME=QUANTITY, repeatable"),
              max_cpu: str | None = typer.Option(None, "--max-cpu"),
              max_memory: str | None = typer.Option(None, "--max-memory"),
              max_gpu: str | None = typer.Option(None, "--max-gpu", help="Maximum nvidia.com/gpu"),
              max_resource: list[str] = typer.Option([], "--max-resource", help="Maximum NAME=QUANTITY, repeatable"),
              output: Format = OutputOpt) -> None:
    """Set a queue's guaranteed and maximum resources (merged into its spec; '' removes one)."""
    def named(cpu_, memory_, gpu_, extra, option):
        values = {"cpu": cpu_, "memory": memory_, "nvidia.com/gpu": gpu_}
        return {**{k: v for k, v in values.items() if v is not None}, **_resources(extra, option)}
    guaranteed = named(cpu, memory, gpu, resource, "--resource")
    maximum = named(max_cpu, max_memory, max_gpu, max_resource, "--max-resource")
    if not guaranteed and not maximum:
        raise typer.BadParameter("give at least one of --cpu, --memory, --gpu, --resource or their --max- forms")
    what = f"admin quota set {queue}"
    client = _client(ctx, what)
    result = call(what, lambda: client.set_quota(queue, guaranteed, maximum))
    _show_change(result, output, ("guaranteed", "max"))


@queue_app.command("add-member")
def add_member(ctx: typer.Context, queue: str = typer.Argument(...), user: str = typer.Argument(...),
               output: Format = OutputOpt) -> None:
    """Let USER submit to QUEUE (a queue listing no members is open to every user until then)."""
    what = f"admin queue add-member {queue} {user}"
    client = _client(ctx, what)
    _show_change(call(what, lambda: client.add_member(queue, user)), output, ("members",))


def _show_change(result: dict, output: Format, fields: tuple[str, ...]) -> None:
    if output != Format.table:
        emit(result, output)
        return
    doc = result["object"]
    _changed(doc["kind"], doc["metadata"]["name"], result["action"])
    for field in fields:
        value = doc["spec"].get(field)
        shown = ", ".join(f"{k}={v}" for k, v in value.items()) if isinstance(value, dict) else ", ".join(value)
        print(f"  {field}: {shown or '-'}")


@token_app.command("create")
def token_create(ctx: typer.Context, role: str = typer.Option(..., "--role", help="admin, user or agent"),
                 subject: str = typer.Option(..., "--subject", help="User name, or the agent's name"),
                 cluster: str | None = typer.Option(None, "--cluster", help="The cluster an agent token serves"),
                 expires: str | None = typer.Option(None, "--expires", help="e.g. 30d, 12h; default: never"),
                 output: Format = OutputOpt) -> None:
    """Create an API token; prints the secret, which is shown only once."""
    from sluice.quantity import QuantityError, parse_duration
    if role not in ("admin", "user", "agent"):
        raise typer.BadParameter(f"--role must be admin, user or agent, got {role!r}")
    if (role == "agent") != bool(cluster):
        raise typer.BadParameter("--cluster is required for agent tokens and only for them")
    try:
        expires_s = round(parse_duration(expires)) if expires else 0
    except QuantityError as exc:
        raise typer.BadParameter(f"--expires: {exc}") from None
    if expires and expires_s <= 0:
        raise typer.BadParameter("--expires: must be at least 1s")
    what = "admin token create"
    client = _client(ctx, what)
    token = call(what, lambda: client.create_token(role, subject, cluster, expires_s))
    if output == Format.table:
        print(token["secret"])
    else:
        emit(token, output)


@token_app.command("list")
def token_list(ctx: typer.Context, output: Format = OutputOpt) -> None:
    """Every token (never its secret)."""
    client = _client(ctx, "admin token list")
    emit(call("admin token list", client.tokens), output,
         [("ID", "id"), ("ROLE", "role"), ("SUBJECT", "subject"), ("CLUSTER", "cluster"), ("CREATED", "createdAt"),
          ("EXPIRES", "expiresAt"), ("REVOKED", "revokedAt")])


@token_app.command("revoke")
def token_revoke(ctx: typer.Context, token_id: int = typer.Argument(..., metavar="ID", min=1)) -> None:
    """Revoke a token: refused everywhere within seconds."""
    what = f"admin token revoke {token_id}"
    client = _client(ctx, what)
    token = call(what, lambda: client.revoke_token(token_id))
    print(f"token {token_id}: {'already revoked' if token['alreadyRevoked'] else 'revoked'}")


@cert_app.command("revoke")
def cert_revoke(ctx: typer.Context, certificate: str = typer.Argument(
        ..., metavar="FILE|SERIAL", help="The agent's certificate (PEM file), or its serial number in hex")) -> None:
    """Revoke an agent's client certificate: refused at once, and its open link ends within seconds."""
    import pathlib

    from sluice.certs import agent_identity
    what = f"admin cert revoke {certificate}"
    serial, cluster, not_after = certificate, None, None
    path = pathlib.Path(certificate)
    if path.is_file():
        try:
            identity = agent_identity(path.read_bytes())
        except OSError as exc:
            raise Failed(what, f"cannot read {path}: {exc.strerror or exc}") from None
        if identity is None:
            raise Failed(what, f"{path} is not an agent certificate (a PEM certificate naming "
                               f"sluice://cluster/NAME); give its serial number instead")
        serial, cluster, not_after = identity.serial, identity.cluster, identity.not_after
    client = _client(ctx, what)
    revoked = call(what, lambda: client.revoke_certificate(serial, cluster, not_after))
    named = f" (cluster {revoked['cluster']})" if revoked["cluster"] else ""
    print(f"certificate {revoked['serial']}{named}: {'already revoked' if revoked['alreadyRevoked'] else 'revoked'}")


@cert_app.command("list")
def cert_list(ctx: typer.Context, output: Format = OutputOpt) -> None:
    """Every revoked agent certificate."""
    client = _client(ctx, "admin cert list")
    emit(call("admin cert list", client.revoked_certificates), output,
         [("SERIAL", "serial"), ("CLUSTER", "cluster"), ("NOT AFTER", "notAfter"), ("REVOKED", "revokedAt")])


def _cluster_state(ctx: typer.Context, command: str, name: str, state: str) -> None:
    what = f"admin cluster {command} {name}"
    client = _client(ctx, what)
    previous = call(what, lambda: client.set_cluster_state(name, state))
    print(f"Cluster/{name}: {state}" + (f" (was {previous})" if previous != state else " (unchanged)"))


@cluster_app.command("cordon")
def cordon(ctx: typer.Context, name: str = typer.Argument(...)) -> None:
    """Give the cluster no new jobs; its running jobs continue."""
    _cluster_state(ctx, "cordon", name, "cordoned")


@cluster_app.command("drain")
def drain(ctx: typer.Context, name: str = typer.Argument(...)) -> None:
    """Mark the cluster draining: no new jobs while its running jobs finish."""
    _cluster_state(ctx, "drain", name, "draining")


@cluster_app.command("uncordon")
def uncordon(ctx: typer.Context, name: str = typer.Argument(...)) -> None:
    """Make the cluster active again: it takes new jobs."""
    _cluster_state(ctx, "uncordon", name, "active")


@app.command()
def audit(ctx: typer.Context, limit: int = typer.Option(100, "--limit", min=1, max=1000, help="The newest N records"),
          after: int = typer.Option(0, "--after", min=0, max=(1 << 63) - 1, help="Records after this id instead"),
          output: Format = OutputOpt) -> None:
    """Admin changes: who did what, when (oldest first)."""
    client = _client(ctx, "admin audit")
    emit(call("admin audit", lambda: client.audit(limit=limit, after_id=after)), output,
         [("ID", "id"), ("AT", "at"), ("ACTOR", "actor"), ("ACTION", "action"), ("KIND", "kind"), ("NAME", "name")])
