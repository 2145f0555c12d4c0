"""docker-compose.yaml validates without a Docker engine and agrees with the project.

Two kinds of checks. The Compose specification's rules that need no engine (known keys, every
service has an image or a build, ``depends_on`` targets exist, named volumes are declared, ports
are well-formed ...), plus ``docker-compose config -q`` (Debian's ``docker-compose``, which needs
no engine). And consistency with the project: the connections preset in the environment are the
ones the DAGs in ``dags/`` use by default, both PostgreSQL servers run ``wal_level=logical``, the
Spark image is the release ``pyspark`` is pinned to, the Airflow image is Airflow 3 and this
package is installed into it from the repository.
"""

from __future__ import annotations

import ast
import itertools
import json
import os
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
import yaml

from tests.support.paths import REPO

COMPOSE = REPO / "docker-compose.yaml"
DAGS = REPO / "dags"
AIRFLOW_DOCKERFILE = "docker/airflow.Dockerfile"

# -- the Compose specification, as far as it can be checked offline --------------------------

TOP_LEVEL_KEYS = {"version", "name", "include", "services", "networks", "volumes", "configs",
                  "secrets", "models"}  # fmt: skip
SERVICE_KEYS = {
    "annotations", "attach", "build", "blkio_config", "cap_add", "cap_drop", "cgroup",
    "cgroup_parent", "command", "configs", "container_name", "cpu_count", "cpu_percent",
    "cpu_period", "cpu_quota", "cpu_rt_period", "cpu_rt_runtime", "cpu_shares", "cpus", "cpuset",
    "credential_spec", "depends_on", "deploy", "develop", "device_cgroup_rules", "devices", "dns",
    "dns_opt", "dns_search", "domainname", "entrypoint", "env_file", "environment", "expose",
    "extends", "external_links", "extra_hosts", "gpus", "group_add", "healthcheck", "hostname",
    "image", "init", "ipc", "isolation", "label_file", "labels", "links", "logging",
    "mac_address", "mem_limit", "mem_reservation", "mem_swappiness", "memswap_limit", "models",
    "network_mode", "networks", "oom_kill_disable", "oom_score_adj", "pid", "pids_limit",
    "platform", "ports", "post_start", "pre_stop", "privileged", "profiles", "provider",
    "pull_policy", "read_only", "restart", "runtime", "scale", "secrets", "security_opt",
    "shm_size", "stdin_open", "stop_grace_period", "stop_signal", "storage_opt", "sysctls",
    "tmpfs", "tty", "ulimits", "use_api_socket", "user", "userns_mode", "uts", "volumes",
    "volumes_from", "working_dir",
}  # fmt: skip
DEPENDS_ON_CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
SERVICE_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
RESTART = re.compile(r"no|always|unless-stopped|on-failure(:\d+)?")
# [[ip:]published:]target[/protocol], each port a number or a range.
_PORT = r"\d+(?:-\d+)?"
PORT = re.compile(
    rf"(?:(?P<ip>\[[0-9a-fA-F:]+\]|[0-9.]+):)?(?:(?P<published>{_PORT})?:)?"
    rf"(?P<target>{_PORT})(?:/(?P<protocol>tcp|udp|sctp))?"
)

# ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?err}, ${VAR?err}, ${VAR:+alt}, ${VAR+alt},
# $VAR, and $$ for a literal dollar.
_VARIABLE = re.compile(r"\$(?:(?P<dollar>\$)|\{(?P<braced>[^}]*)\}|(?P<plain>[A-Za-z_]\w*))")
_BRACED = re.compile(r"(?P<name>[A-Za-z_]\w*)(?:(?P<op>:?[-?+])(?P<arg>.*))?", re.DOTALL)


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """Compose's variable interpolation (no nesting), with ``env`` as the environment."""

    def one(match: re.Match[str]) -> str:
        if match["dollar"]:
            return "$"
        if match["plain"]:
            return env.get(match["plain"], "")
        braced = _BRACED.fullmatch(match["braced"])
        assert braced, f"invalid interpolation {match[0]!r}"
        name, op, arg = braced["name"], braced["op"], braced["arg"] or ""
        assert "${" not in arg, f"nested interpolation is not supported here: {match[0]!r}"
        value = env.get(name)
        if op is None:
            return value or ""
        is_set = bool(value) if op.startswith(":") else value is not None
        if op.endswith("-"):
            return value if is_set and value is not None else arg
        if op.endswith("+"):
            return arg if is_set else ""
        assert value, f"{name} is required ({arg}) but has no default: {match[0]!r}"
        return value

    return _VARIABLE.sub(one, text)


def resolve(node: Any, env: Mapping[str, str]) -> Any:
    """The document with every string value interpolated (keys are not, as in Compose)."""
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [resolve(item, env) for item in node]
    if isinstance(node, dict):
        return {key: resolve(value, env) for key, value in node.items()}
    return node


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    """The compose file as written (anchors and merge keys applied by the YAML loader)."""
    document = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(document, dict), "docker-compose.yaml must be a mapping"
    return document


@pytest.fixture(scope="module")
def compose(raw: dict[str, Any]) -> dict[str, Any]:
    """The compose file as Compose sees it with no variables set: every default applied."""
    resolved: dict[str, Any] = resolve(raw, {})
    return resolved


def services(compose: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = compose["services"]
    return found


def environment(service: Mapping[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(key): "" if value is None else str(value) for key, value in env.items()}


def command_words(service: Mapping[str, Any], key: str = "command") -> list[str]:
    value = service.get(key) or []
    return value.split() if isinstance(value, str) else [str(word) for word in value]


def airflow_services(compose: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The services that run an Airflow component (they carry Airflow's executor setting)."""
    return {
        name: svc
        for name, svc in services(compose).items()
        if "AIRFLOW__CORE__EXECUTOR" in environment(svc)
    }


def depends_on(service: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    value = service.get("depends_on") or {}
    if isinstance(value, list):
        return {name: {"condition": "service_started"} for name in value}
    return {name: spec or {"condition": "service_started"} for name, spec in value.items()}


def image_ref(image: str) -> tuple[str, str]:
    """``(repository, tag)`` of an image reference (``latest`` when no tag is given)."""
    image = image.split("@", 1)[0]
    name, _, tag = image.rpartition(":")
    if not name or "/" in tag:
        return image, "latest"
    return name, tag


# -- Compose specification ---------------------------------------------------------------------


def test_top_level_keys_are_known(raw: dict[str, Any]) -> None:
    unknown = {k for k in raw if k not in TOP_LEVEL_KEYS and not str(k).startswith("x-")}
    assert not unknown, f"unknown top-level keys: {sorted(unknown)}"
    assert raw.get("services"), "no services"


def test_service_names_and_keys_are_valid(compose: dict[str, Any]) -> None:
    for name, svc in services(compose).items():
        assert SERVICE_NAME.fullmatch(name), f"invalid service name {name!r}"
        unknown = {k for k in svc if k not in SERVICE_KEYS and not str(k).startswith("x-")}
        assert not unknown, f"service {name}: unknown keys {sorted(unknown)}"


def test_every_service_has_an_image_or_a_build(compose: dict[str, Any]) -> None:
    for name, svc in services(compose).items():
        assert svc.get("image") or svc.get("build"), f"service {name}: neither image nor build"
        build = svc.get("build")
        if build is None:
            continue
        if isinstance(build, str):
            build = {"context": build}
        context = REPO / build.get("context", ".")
        assert context.is_dir(), f"service {name}: build context {context} does not exist"
        dockerfile = context / build.get("dockerfile", "Dockerfile")
        assert dockerfile.is_file(), f"service {name}: {dockerfile} does not exist"


def test_depends_on_targets_exist_and_form_no_cycle(compose: dict[str, Any]) -> None:
    all_services = services(compose)
    for name, svc in all_services.items():
        for target, spec in depends_on(svc).items():
            assert target in all_services, f"service {name} depends on unknown {target!r}"
            assert target != name, f"service {name} depends on itself"
            condition = spec.get("condition", "service_started")
            assert condition in DEPENDS_ON_CONDITIONS, f"{name} -> {target}: {condition!r}"
            if condition == "service_healthy":
                assert all_services[target].get("healthcheck"), (
                    f"service {name} waits for {target} to be healthy, but {target} has no "
                    f"healthcheck"
                )

    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"depends_on cycle: {' -> '.join((*path, name))}"
        if name in done:
            return
        for target in depends_on(all_services[name]):
            visit(target, (*path, name))
        done.add(name)

    for name in all_services:
        visit(name, ())


def _volume_source(entry: Any) -> tuple[str | None, str]:
    """``(source, target)`` of a service volume in short or long syntax."""
    if isinstance(entry, dict):
        return entry.get("source"), str(entry["target"])
    parts = str(entry).split(":")
    if len(parts) == 1:
        return None, parts[0]  # an anonymous volume
    return parts[0], parts[1]


def test_volumes_are_declared_and_bind_sources_exist(compose: dict[str, Any]) -> None:
    declared = set((compose.get("volumes") or {}).keys())
    used: set[str] = set()
    for name, svc in services(compose).items():
        for entry in svc.get("volumes") or []:
            source, target = _volume_source(entry)
            assert target.startswith("/"), f"service {name}: volume target {target!r} not absolute"
            if source is None:
                continue
            if source.startswith((".", "/", "~")):
                if source.startswith("."):
                    assert (REPO / source).exists(), f"service {name}: bind source {source} missing"
                continue
            assert source in declared, f"service {name}: volume {source!r} not declared"
            used.add(source)
    assert not declared - used, f"declared but unused volumes: {sorted(declared - used)}"


def test_ports_are_well_formed_and_unique(compose: dict[str, Any]) -> None:
    published: dict[str, str] = {}
    for name, svc in services(compose).items():
        for entry in svc.get("ports") or []:
            if isinstance(entry, dict):
                assert 1 <= int(entry["target"]) <= 65535, f"service {name}: {entry}"
                continue
            match = PORT.fullmatch(str(entry))
            assert match, f"service {name}: malformed port {entry!r}"
            for group in ("published", "target"):
                if match[group]:
                    for number in match[group].split("-"):
                        assert 1 <= int(number) <= 65535, f"service {name}: port {entry!r}"
            if match["published"]:
                key = f"{match['ip'] or '*'}:{match['published']}/{match['protocol'] or 'tcp'}"
                assert key not in published, f"{name} and {published.get(key)} both publish {key}"
                published[key] = name


def test_environment_restart_and_healthchecks_are_well_formed(compose: dict[str, Any]) -> None:
    for name, svc in services(compose).items():
        env = svc.get("environment")
        if isinstance(env, dict):
            for key, value in env.items():
                assert ENV_NAME.fullmatch(key), f"service {name}: bad variable name {key!r}"
                assert value is None or isinstance(value, str | int | float | bool), (
                    f"service {name}: {key} must be a scalar"
                )
        elif env is not None:
            assert isinstance(env, list), f"service {name}: environment must be a map or list"
        if "restart" in svc:
            assert RESTART.fullmatch(str(svc["restart"])), f"service {name}: restart policy"
        check = svc.get("healthcheck")
        if check and not check.get("disable"):
            test = check["test"]
            if isinstance(test, list):
                assert test[0] in ("CMD", "CMD-SHELL", "NONE"), f"service {name}: {test}"
            else:
                assert isinstance(test, str), f"service {name}: healthcheck test"


def _compose_cli() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker"):
        probe = subprocess.run(
            ["docker", "compose", "version"], capture_output=True, text=True, check=False
        )
        if probe.returncode == 0:
            return ["docker", "compose"]
    return None


@pytest.mark.docker
def test_docker_compose_config_accepts_the_file() -> None:
    cli = _compose_cli()
    assert cli is not None, (
        "neither docker-compose nor the docker compose plugin is installed, so the compose file "
        "cannot be validated by Compose itself. Fix: apt-get install docker-compose (Debian's "
        "v1, which validates without a Docker engine), or run scripts/bootstrap-system.sh"
    )
    # A clean environment: the defaults in the file are what is validated.
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/")}
    result = subprocess.run(
        [*cli, "--project-directory", str(REPO), "-f", str(COMPOSE), "config", "-q"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"{' '.join(cli)} config -q failed:\n{result.stderr}"


# -- consistency with the project --------------------------------------------------------------


def _string(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _is_environ_get(call: ast.Call) -> bool:
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr == "get":
        target = func.value
        return isinstance(target, ast.Attribute) and target.attr == "environ"
    return isinstance(func, ast.Attribute) and func.attr == "getenv"


def dag_connection_ids(path: Path) -> tuple[set[str], dict[str, str]]:
    """Connection ids a DAG file uses by default, and the env variables that override them.

    Found: ``*conn_id`` keyword arguments and params given as plain strings or ``Param("...")``,
    and ``os.environ.get("..._CONN_ID", "default")``. Templated values (``{{ params.x }}``)
    resolve to a param, which is found through the params dict.
    """
    conn_ids: set[str] = set()
    env_overrides: dict[str, str] = {}
    tree = ast.parse(path.read_text(), filename=str(path))

    def literal(node: ast.AST | None) -> str | None:
        if isinstance(node, ast.Call) and node.args and _call_name(node) == "Param":
            return _string(node.args[0])
        return _string(node)

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            if _is_environ_get(node) and len(node.args) >= 2:
                name, default = _string(node.args[0]), _string(node.args[1])
                if name and default and name.upper().endswith("CONN_ID"):
                    env_overrides[name] = default
                    conn_ids.add(default)
            for keyword in node.keywords:
                value = literal(keyword.value)
                if keyword.arg and keyword.arg.endswith("conn_id") and value and "{{" not in value:
                    conn_ids.add(value)
        elif isinstance(node, ast.Dict):
            for key, value_node in zip(node.keys, node.values, strict=True):
                name, value = _string(key), literal(value_node)
                if name and name.endswith("conn_id") and value and "{{" not in value:
                    conn_ids.add(value)
    return conn_ids, env_overrides


def _call_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def all_dag_connections() -> Iterator[tuple[Path, set[str], dict[str, str]]]:
    paths = sorted(DAGS.glob("*.py"))
    assert paths, f"no DAG files in {DAGS}"
    for path in paths:
        conn_ids, overrides = dag_connection_ids(path)
        yield path, conn_ids, overrides


def test_dag_connection_ids_are_found() -> None:
    """The extraction itself works on the drain DAG (otherwise the next test proves nothing)."""
    conn_ids, overrides = dag_connection_ids(DAGS / "pglogrepl_incremental_drain.py")
    assert "pglogrepl_publisher" in conn_ids
    assert overrides.get("PGLOGREPL_SPARK_CONN_ID") == "spark_local"


def test_connections_preset_for_every_conn_id_the_dags_use(compose: dict[str, Any]) -> None:
    components = airflow_services(compose)
    assert components, "no Airflow services (none sets AIRFLOW__CORE__EXECUTOR)"
    for name, svc in components.items():
        env = environment(svc)
        for path, conn_ids, overrides in all_dag_connections():
            # What the stack sets for an override variable is used too.
            wanted = conn_ids | {env[var] for var in overrides if env.get(var)}
            for conn_id in sorted(wanted):
                variable = f"AIRFLOW_CONN_{conn_id.upper()}"
                assert env.get(variable), (
                    f"service {name}: {path.name} uses connection {conn_id!r} but {variable} is "
                    f"not set"
                )


def _connection(env: Mapping[str, str], variable: str) -> dict[str, Any]:
    """An ``AIRFLOW_CONN_*`` value (JSON or URI) as conn_type/host/port/login/password/schema."""
    value = env[variable]
    if value.lstrip().startswith("{"):
        conn: dict[str, Any] = json.loads(value)
        return conn
    parts = urlsplit(value)
    return {
        "conn_type": parts.scheme.replace("-", "_"),
        "host": parts.hostname,
        "port": parts.port,
        "login": unquote(parts.username or ""),
        "password": unquote(parts.password or ""),
        "schema": unquote(parts.path.lstrip("/")),
    }


def _settings(service: Mapping[str, Any]) -> dict[str, str]:
    """``-c name=value`` settings of a ``postgres`` command."""
    words = command_words(service)
    found: dict[str, str] = {}
    for flag, setting in itertools.pairwise(words):
        if flag == "-c" and "=" in setting:
            key, value = setting.split("=", 1)
            found[key] = value
    for word in words:
        if word.startswith("--") and "=" in word:
            key, value = word[2:].split("=", 1)
            found[key.replace("-", "_")] = value
    return found


def _is_official_postgres(service: Mapping[str, Any]) -> bool:
    repository, _ = image_ref(str(service.get("image", "")))
    return repository in ("postgres", "library/postgres", "docker.io/library/postgres")


def test_publisher_and_subscriber_run_logical_wal(compose: dict[str, Any]) -> None:
    all_services = services(compose)
    for name in ("publisher", "subscriber"):
        assert name in all_services, f"no {name} service"
        svc = all_services[name]
        assert _is_official_postgres(svc), f"{name}: not the official postgres image"
        assert command_words(svc)[:1] == ["postgres"], f"{name}: command must start the server"
        settings = _settings(svc)
        assert settings.get("wal_level") == "logical", f"{name}: wal_level is not logical"
        assert int(settings.get("max_replication_slots", "10")) >= 4, name


def test_postgres_servers_run_versions_the_tests_cover(compose: dict[str, Any]) -> None:
    """Publisher and subscriber default to majors the suite runs on (15 in full, 18 as the
    upgrade's new primary), and an 18+ image gets its data volume where 18's image keeps data
    (a mount at /var/lib/postgresql/data stops it from starting)."""
    from airflow_pglogrepl.versions import SUPPORTED_MAJORS

    for name in ("publisher", "subscriber"):
        svc = services(compose)[name]
        major = int(str(svc["image"]).rpartition(":")[2].split(".")[0].split("-")[0])
        assert major in SUPPORTED_MAJORS, f"{name}: PostgreSQL {major} is not tested"
        targets = [str(v).split(":")[1] for v in svc.get("volumes", [])]
        if major >= 18:
            assert "/var/lib/postgresql" in targets and "/var/lib/postgresql/data" not in targets
    assert services(compose)["subscriber"]["image"].endswith(":18")


def test_postgres_connections_reach_logical_servers(compose: dict[str, Any]) -> None:
    all_services = services(compose)
    for name, svc in airflow_services(compose).items():
        env = environment(svc)
        postgres_conns = [
            var
            for var in env
            if var.startswith("AIRFLOW_CONN_")
            and _connection(env, var)["conn_type"] in ("postgres", "postgresql", "pglogrepl")
        ]
        assert postgres_conns, f"service {name}: no PostgreSQL connections"
        for variable in postgres_conns:
            conn = _connection(env, variable)
            host = conn["host"]
            assert host in all_services, f"{name}: {variable} points at unknown host {host!r}"
            server = all_services[host]
            assert _is_official_postgres(server), f"{variable}: {host} is not a postgres service"
            assert _settings(server).get("wal_level") == "logical", f"{variable}: {host}"
            server_env = environment(server)
            assert conn["port"] in (None, 5432), f"{variable}: port inside the network is 5432"
            assert conn["schema"] == server_env.get("POSTGRES_DB"), f"{variable}: database"
            assert conn["login"] == server_env.get("POSTGRES_USER", "postgres"), variable
            assert conn["password"] == server_env.get("POSTGRES_PASSWORD"), (
                f"{variable}: the password differs from {host}'s POSTGRES_PASSWORD"
            )


def test_spark_connections_reach_a_master(compose: dict[str, Any]) -> None:
    all_services = services(compose)
    for name, svc in airflow_services(compose).items():
        env = environment(svc)
        spark = {
            var: _connection(env, var)
            for var in env
            if var.startswith("AIRFLOW_CONN_") and env[var].lstrip().startswith("{")
        }
        spark = {var: conn for var, conn in spark.items() if conn.get("conn_type") == "spark"}
        assert spark, f"service {name}: no Spark connection"
        for variable, conn in spark.items():
            host = str(conn.get("host", ""))
            if host.startswith("local"):
                continue
            assert host.startswith("spark://"), f"{variable}: only local or standalone masters"
            master = host.removeprefix("spark://").split(":")[0]
            assert master in all_services, f"{variable}: no service {master!r}"
            port = str(conn.get("port") or host.rpartition(":")[2])
            assert port in command_words(all_services[master]), (
                f"{variable}: {master} does not listen on port {port}"
            )


def _pyspark_pin() -> str:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    for requirement in pyproject["project"]["dependencies"]:
        match = re.fullmatch(r"\s*pyspark\s*==\s*([\w.]+)\s*", requirement)
        if match:
            return match[1]
    raise AssertionError("pyproject.toml does not pin pyspark==X.Y.Z")


SPARK_IMAGES = ("apache/spark", "spark", "library/spark", "bitnami/spark", "docker.io/apache/spark")


def test_spark_image_is_the_pinned_pyspark_release(compose: dict[str, Any]) -> None:
    pin = _pyspark_pin()
    spark_services = {
        name: image_ref(str(svc["image"]))
        for name, svc in services(compose).items()
        if svc.get("image")
        and not svc.get("build")
        and image_ref(str(svc["image"]))[0] in SPARK_IMAGES
    }
    assert spark_services, "no service runs an official Spark image"
    for name, (_, tag) in spark_services.items():
        assert tag == pin or tag.startswith(f"{pin}-"), (
            f"service {name}: Spark {tag} but pyproject.toml pins pyspark=={pin}"
        )
    # Every Spark process is on that release: the others run pyspark from the Airflow image.
    for name, svc in services(compose).items():
        words = command_words(svc, "entrypoint") + command_words(svc)
        if any(word.startswith("org.apache.spark.deploy.") for word in words):
            assert name in spark_services or _builds_airflow_image(svc), (
                f"service {name} runs Spark from an image whose Spark version is not checked"
            )


def _builds_airflow_image(service: Mapping[str, Any]) -> bool:
    build = service.get("build")
    return isinstance(build, dict) and build.get("dockerfile") == AIRFLOW_DOCKERFILE


def _dockerfile() -> str:
    return (REPO / AIRFLOW_DOCKERFILE).read_text()


def test_airflow_image_is_airflow_3(compose: dict[str, Any]) -> None:
    text = _dockerfile()
    defaults = dict(re.findall(r"^ARG\s+(\w+)=(\S+)", text, re.MULTILINE))
    bases = re.findall(r"^FROM\s+(\S+)", text, re.MULTILINE)
    assert bases, f"{AIRFLOW_DOCKERFILE} has no FROM"
    built = [svc for svc in services(compose).values() if _builds_airflow_image(svc)]
    assert built, f"no service builds {AIRFLOW_DOCKERFILE}"
    for svc in built:
        args = {**defaults, **{k: str(v) for k, v in (svc["build"].get("args") or {}).items()}}
        for base in bases:
            image = interpolate(base, args)
            repository, tag = image_ref(image)
            assert repository in ("apache/airflow", "docker.io/apache/airflow"), (
                f"the Airflow image must be the official apache/airflow, not {image}"
            )
            assert tag.split(".")[0] == "3", f"Airflow image {image} is not Airflow 3"
    # The default in the Dockerfile alone is Airflow 3 too (a plain docker build).
    for base in bases:
        assert image_ref(interpolate(base, defaults))[1].startswith("3."), base


def test_package_is_installed_from_the_repository(compose: dict[str, Any]) -> None:
    text = _dockerfile()
    copies = re.findall(r"^COPY\s+(?:--\S+\s+)*(.+)$", text, re.MULTILINE)
    copied: dict[str, str] = {}
    for line in copies:
        *sources, destination = line.split()
        for source in sources:
            copied[source.rstrip("/")] = destination.rstrip("/")
    for needed in ("pyproject.toml", "airflow_pglogrepl"):
        assert needed in copied, f"{AIRFLOW_DOCKERFILE} does not copy {needed} from the repo"
    project_dir = copied["pyproject.toml"]
    installs = " ".join(re.findall(r"pip install ([^&\n\\]+)", text))
    assert re.search(rf"(^|\s){re.escape(project_dir)}/?(\s|$|\[)", installs), (
        f"{AIRFLOW_DOCKERFILE} does not pip install {project_dir} (the copied repository)"
    )
    for svc in services(compose).values():
        if _builds_airflow_image(svc):
            assert (REPO / svc["build"].get("context", ".")).resolve() == REPO, (
                "the Airflow image's build context must be the repository root"
            )
    ignore = REPO / f"{AIRFLOW_DOCKERFILE}.dockerignore"
    if ignore.exists():
        lines = [line.strip() for line in ignore.read_text().splitlines()]
        for needed in ("pyproject.toml", "airflow_pglogrepl"):
            if "*" in lines:
                assert any(line.rstrip("/") == f"!{needed}" for line in lines), (
                    f"{ignore.name} leaves {needed} out of the build context"
                )


def test_airflow_3_components_with_local_executor(compose: dict[str, Any]) -> None:
    components = airflow_services(compose)
    commands = {name: command_words(svc) for name, svc in components.items()}
    running = {words[0] for words in commands.values() if words}
    for component in ("api-server", "scheduler", "dag-processor", "triggerer"):
        assert component in running, f"no service runs airflow {component}"
    for name, svc in components.items():
        env = environment(svc)
        assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor", name
        metadata = urlsplit(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
        assert metadata.scheme.startswith("postgresql"), f"{name}: metadata DB is not PostgreSQL"
        replicated = {
            _connection(env, var)["host"]
            for var in env
            if var.startswith("AIRFLOW_CONN_") and not env[var].lstrip().startswith("{")
        }
        assert metadata.hostname in services(compose), f"{name}: metadata host is no service"
        assert metadata.hostname not in replicated, (
            f"{name}: the metadata database must have its own PostgreSQL, not {metadata.hostname}"
        )


def test_init_migrates_before_the_components_start(compose: dict[str, Any]) -> None:
    all_services = services(compose)
    init = [
        name
        for name, svc in airflow_services(compose).items()
        if "airflow db migrate" in " ".join(command_words(svc, "entrypoint") + command_words(svc))
    ]
    assert len(init) == 1, f"expected one service running 'airflow db migrate', found {init}"
    for name, svc in airflow_services(compose).items():
        words = command_words(svc)
        if words and words[0] in ("api-server", "scheduler", "dag-processor", "triggerer"):
            condition = depends_on(svc).get(init[0], {}).get("condition")
            assert condition == "service_completed_successfully", (
                f"service {name} must wait for {init[0]} to complete"
            )
    assert all_services[init[0]].get("restart") in (None, "no"), "init must run once"


def test_dags_folder_is_mounted(compose: dict[str, Any]) -> None:
    for name, svc in airflow_services(compose).items():
        if command_words(svc)[:1] not in (["scheduler"], ["dag-processor"], ["triggerer"]):
            continue
        folder = environment(svc).get("AIRFLOW__CORE__DAGS_FOLDER", "/opt/airflow/dags")
        mounts = {_volume_source(entry) for entry in svc.get("volumes") or []}
        assert any(
            source and (REPO / source).resolve() == DAGS and target == folder
            for source, target in mounts
        ), f"service {name}: ./dags is not mounted at {folder}"


SECRET_NAME = re.compile(r"PASSWORD|SECRET|FERNET|TOKEN|_KEY$")


def test_secrets_are_placeholders_with_defaults(raw: dict[str, Any]) -> None:
    """Secrets come from ``${VAR:-default}``: overridable, never only hard-coded."""
    for name, svc in raw["services"].items():
        for key, value in environment(svc).items():
            if SECRET_NAME.search(key) and not key.endswith("_FILE"):
                assert value.startswith("${") and value.endswith("}"), (
                    f"service {name}: {key} is hard-coded; use ${{VAR:-default}}"
                )
            if key.startswith("AIRFLOW_CONN_") or key.endswith("SQL_ALCHEMY_CONN"):
                password = urlsplit(value).password if "://" in value else None
                if password is not None:
                    assert password.startswith("${"), f"service {name}: password in {key}"
