"""The CLI's security options: how ``serve`` listens (``--listener``, TLS, SASL), how every client
verb connects (one :class:`~transport.security.ClientSecurity` built from ``--tls-*`` and
``--sasl-*``), the ``users`` verbs that keep SCRAM credentials and the ``acls`` verbs that keep
access rules. Like every verb they ask a running broker (``--bootstrap``, as a principal that may
alter the cluster), which writes the metadata store every broker reads them from
(docs/design.md#who-may-do-what). Their offline forms write the store directly, to make a
cluster's first super user before any broker runs: ``--data-dir`` (the embedded store of a
stopped broker, which holds its lock while it runs) or ``--zookeeper``.

Passwords never come from argv, where ``ps`` shows them to every user of the machine: a client
reads its password from ``--password-file`` or ``$COORDINATOR_PASSWORD``, else a prompt; ``users
add`` from a prompt (twice) or, with ``--password-stdin``, from the first line of stdin; ``serve``
its ZooKeeper and inter-broker passwords from a file or the environment.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

from consumer.admin import open_admin
from protocol.sasl import MECHANISMS
from statemachine.acl import CLUSTER, Acl, Operation, ResourceType, parse_principal
from store import SecurityStore, StoreUnavailable, open_embedded_store
from store.zookeeper import DigestAuth, open_zookeeper_store
from transport.connect import DEFAULT_BOOTSTRAP, parse_bootstrap
from transport.scram import make_credential
from transport.security import ClientSecurity, Endpoint, ServerTls

PASSWORD_VARIABLE = "COORDINATOR_PASSWORD"
ZOOKEEPER_PASSWORD_VARIABLE = "COORDINATOR_ZOOKEEPER_PASSWORD"
INTER_BROKER_PASSWORD_VARIABLE = "COORDINATOR_INTER_BROKER_PASSWORD"


def add_zookeeper_auth_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--zookeeper-user",
        help="authenticate to ZooKeeper (digest) as this user; the znodes made are then its "
        f"alone. The password: --zookeeper-password-file or ${ZOOKEEPER_PASSWORD_VARIABLE}",
    )
    parser.add_argument(
        "--zookeeper-password-file",
        type=Path,
        metavar="FILE",
        help="--zookeeper-user's password, the file's first line",
    )


def zookeeper_auth(args: argparse.Namespace) -> DigestAuth | None:
    password = _service_password(
        "zookeeper", args.zookeeper_user, args.zookeeper_password_file, ZOOKEEPER_PASSWORD_VARIABLE
    )
    if password is None:
        return None
    return DigestAuth(user=args.zookeeper_user, password=password)


def _service_password(
    option: str, user: str | None, path: Path | None, variable: str
) -> str | None:
    """The password of ``--OPTION-user`` (None without one): the first line of
    ``--OPTION-password-file``, else ``$VARIABLE``; never argv, nor a prompt a service has no
    terminal for."""
    if user is None:
        if path is not None:
            raise ValueError(f"--{option}-password-file needs --{option}-user")
        return None
    if path is not None:
        return _first_line(path)
    if variable in os.environ:
        return os.environ[variable]
    raise ValueError(f"--{option}-user needs --{option}-password-file or ${variable}")


def _first_line(path: Path) -> str:
    lines = path.read_text().splitlines()
    return lines[0] if lines else ""


def add_serve_options(serve: argparse.ArgumentParser) -> None:
    add_zookeeper_auth_options(serve)
    group = serve.add_argument_group("security (README: Security)")
    group.add_argument(
        "--listener",
        action="append",
        type=_endpoint,
        default=[],
        metavar="NAME://HOST:PORT",
        help="listen here; NAME is PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL; repeat for "
        "several (default: PLAINTEXT://--host:--port). The first one's port is printed.",
    )
    group.add_argument(
        "--advertised-listener",
        action="append",
        type=_endpoint,
        default=[],
        metavar="NAME://HOST:PORT",
        help="the address clients of listener NAME are told to reach this broker at "
        "(default: the listener's own)",
    )
    group.add_argument("--tls-cert", type=Path, help="the broker's certificate (PEM)")
    group.add_argument("--tls-key", type=Path, help="the certificate's private key (PEM)")
    group.add_argument(
        "--tls-client-ca",
        type=Path,
        help="require client certificates signed by this CA (mutual TLS); the certificate's "
        "subject is the client's principal",
    )
    group.add_argument(
        "--tls-ca",
        type=Path,
        help="the CA that signed the other brokers' certificates, trusted when connecting to "
        "them (default: --tls-client-ca, else the system's CAs)",
    )
    group.add_argument(
        "--tls-principal",
        choices=["subject", "cn"],
        default="subject",
        help="a client certificate's principal: User:<its subject> (User:CN=alice,O=Example) "
        "or User:<its common name> (User:alice)",
    )
    group.add_argument(
        "--super-users",
        default="",
        metavar="PRINCIPAL[;PRINCIPAL...]",
        help="principals every access rule lets do everything (User:admin;User:CN=ops)",
    )
    group.add_argument(
        "--sasl-mechanisms",
        default=",".join(MECHANISMS),
        help="what the SASL listeners offer (default: %(default)s)",
    )
    group.add_argument(
        "--inter-broker-listener",
        metavar="NAME",
        type=str.upper,
        help="the listener brokers reach each other on, for replication (Kafka's "
        "inter.broker.listener.name; default: the first --listener); a broker presents its "
        "--tls-cert to it, trusting --tls-ca",
    )
    group.add_argument(
        "--inter-broker-user",
        metavar="NAME",
        help="the SCRAM user this broker authenticates as to its peers' SASL listener (a super "
        "user). The password: --inter-broker-password-file or "
        f"${INTER_BROKER_PASSWORD_VARIABLE}",
    )
    group.add_argument(
        "--inter-broker-password-file",
        type=Path,
        metavar="FILE",
        help="--inter-broker-user's password, the file's first line",
    )
    group.add_argument(
        "--inter-broker-sasl-mechanism",
        type=str.upper,
        choices=MECHANISMS,
        help="the mechanism of --inter-broker-user (default: the first of --sasl-mechanisms)",
    )


def serve_security(args: argparse.Namespace) -> dict[str, object]:
    """NodeSettings' security fields from ``serve``'s options."""
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ValueError("--tls-cert and --tls-key go together")
    for given, name in ((args.tls_client_ca, "--tls-client-ca"), (args.tls_ca, "--tls-ca")):
        if given is not None and args.tls_cert is None:
            raise ValueError(f"{name} needs --tls-cert and --tls-key")
    mechanisms = tuple(m.strip().upper() for m in args.sasl_mechanisms.split(",") if m.strip())
    unknown = set(mechanisms) - set(MECHANISMS)
    if unknown or not mechanisms:
        raise ValueError(f"--sasl-mechanisms: one or more of {', '.join(MECHANISMS)}")
    super_users = frozenset(
        parse_principal(p.strip()) for p in args.super_users.split(";") if p.strip()
    )
    return {
        **_inter_broker(args),
        "zookeeper_auth": zookeeper_auth(args),
        "super_users": super_users,
        "tls_principal_is_cn": args.tls_principal == "cn",
        "listeners": tuple(args.listener),
        "advertised_listeners": tuple(args.advertised_listener),
        "tls": None
        if args.tls_cert is None
        else ServerTls(cert=args.tls_cert, key=args.tls_key, client_ca=args.tls_client_ca),
        "sasl_mechanisms": mechanisms,
    }


def _inter_broker(args: argparse.Namespace) -> dict[str, object]:
    """NodeSettings' inter-broker fields: the password, like ZooKeeper's, from a file or the
    environment, never from argv."""
    password = _service_password(
        "inter-broker",
        args.inter_broker_user,
        args.inter_broker_password_file,
        INTER_BROKER_PASSWORD_VARIABLE,
    )
    return {
        "inter_broker_listener": args.inter_broker_listener,
        "inter_broker_user": args.inter_broker_user,
        "inter_broker_password": password,
        "inter_broker_sasl_mechanism": args.inter_broker_sasl_mechanism,
        "tls_ca": args.tls_ca,
    }


def add_bootstrap_option(parser: argparse._ActionsContainer) -> None:
    """``--bootstrap``, as every client verb takes it (``--bootstrap-server``: Kafka's tools'
    name for it)."""
    parser.add_argument(
        "--bootstrap",
        "--bootstrap-server",
        dest="bootstrap",
        type=_bootstrap_addresses,
        default=parse_bootstrap(DEFAULT_BOOTSTRAP),
        metavar="HOST:PORT[,HOST:PORT...]",
        help=f"brokers to ask first (default {DEFAULT_BOOTSTRAP})",
    )


def _bootstrap_addresses(text: str) -> list[tuple[str, int]]:
    try:
        return parse_bootstrap(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_client_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("security")
    group.add_argument(
        "--tls", action="store_true", help="connect with TLS, trusting the system's CAs"
    )
    group.add_argument("--tls-ca", type=Path, help="connect with TLS, trusting this CA (PEM)")
    group.add_argument("--tls-cert", type=Path, help="a client certificate, for mutual TLS")
    group.add_argument("--tls-key", type=Path, help="the client certificate's key")
    group.add_argument(
        "--sasl-mechanism", choices=MECHANISMS, help="authenticate with SASL/SCRAM as --user"
    )
    group.add_argument("--user", help="the SASL user name")
    group.add_argument(
        "--password-file",
        type=Path,
        help=f"read the SASL password from this file's first line (else ${PASSWORD_VARIABLE}, "
        "else a prompt)",
    )


def client_security(args: argparse.Namespace) -> ClientSecurity:
    """The one settings object every client of this command connects with."""
    password = None
    if args.sasl_mechanism is not None:
        if not args.user:
            raise ValueError("--sasl-mechanism needs --user")
        password = _client_password(args.password_file, args.user)
    elif args.user:
        raise ValueError("--user needs --sasl-mechanism")
    return ClientSecurity(
        tls=args.tls,
        ca=args.tls_ca,
        cert=args.tls_cert,
        key=args.tls_key,
        sasl_mechanism=args.sasl_mechanism,
        username=args.user,
        password=password,
    )


def _client_password(path: Path | None, user: str) -> str:
    if path is not None:
        return _first_line(path)
    if PASSWORD_VARIABLE in os.environ:
        return os.environ[PASSWORD_VARIABLE]
    return _prompt(f"password for {user}: ", f"pass --password-file FILE or ${PASSWORD_VARIABLE}")


def _prompt(prompt: str, otherwise: str) -> str:
    """A password typed at the terminal, which getpass reads from ``/dev/tty``; without one
    (a service, a pipeline, ``</dev/null``) a ValueError saying ``otherwise``, rather than
    getpass's fallback to stdin, which ends in a traceback."""
    try:
        os.close(os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY))
    except OSError:
        raise ValueError(f"no terminal to ask for the password on: {otherwise}") from None
    try:
        return getpass.getpass(prompt)
    except EOFError:
        raise ValueError(f"no password typed: {otherwise}") from None


def add_user_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    users = commands.add_parser(
        "users", help="add, delete or list SASL/SCRAM users (of a running cluster, or offline)"
    )
    verbs = users.add_subparsers(dest="verb", required=True, metavar="VERB")
    add = verbs.add_parser("add", help="add a user, or set its password")
    add.add_argument("name", help="the user's name")
    add.add_argument(
        "--mechanism",
        choices=MECHANISMS,
        action="append",
        help="store a credential for this mechanism only (repeatable; default: both)",
    )
    add.add_argument(
        "--password-stdin", action="store_true", help="read the password from stdin's first line"
    )
    delete = verbs.add_parser("delete", help="delete a user")
    delete.add_argument("name", help="the user's name")
    listed = verbs.add_parser("list", help="list users and their mechanisms")
    for parser in (add, delete, listed):
        _add_store_options(parser)


def add_acl_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    acls = commands.add_parser(
        "acls", help="add, remove or list access rules (of a running cluster, or offline)"
    )
    verbs = acls.add_subparsers(dest="verb", required=True, metavar="VERB")
    add = verbs.add_parser("add", help="allow a principal operations on a resource")
    remove = verbs.add_parser("remove", help="remove such rules")
    listed = verbs.add_parser("list", help="list the rules")
    for parser in (add, remove):
        parser.add_argument(
            "--principal",
            required=True,
            type=_principal,
            help="User:NAME (a SCRAM user), User:CN=... (a certificate's subject), or * (anyone)",
        )
        parser.add_argument(
            "--operation",
            required=True,
            action="append",
            choices=[o.value for o in Operation],
            help="repeatable",
        )
        resource = parser.add_mutually_exclusive_group(required=True)
        resource.add_argument("--topic", help="a topic's name, or * for every topic")
        resource.add_argument("--group", help="a group's name, or * for every group")
        resource.add_argument("--cluster", action="store_true", help="the cluster")
    for parser in (add, remove, listed):
        _add_store_options(parser)


async def run_acls(args: argparse.Namespace) -> None:
    rules = [] if args.verb == "list" else _rules(args)
    if _offline(args):
        async with _store(args) as store:
            if args.verb == "list":
                _print_acls(await store.acls())
            elif args.verb == "add":
                await store.change_acls(rules, ())
            else:
                _check_present(rules, await store.acls())
                await store.change_acls((), rules)
        return
    async with open_admin(args.bootstrap, security=client_security(args)) as admin:
        if args.verb == "list":
            _print_acls(await admin.acls())
        elif args.verb == "add":
            await admin.create_acls(rules)
        else:
            _check_present(rules, await admin.acls())
            await admin.delete_acls(rules)


def _rules(args: argparse.Namespace) -> list[Acl]:
    if args.cluster:
        resource, name = ResourceType.CLUSTER, CLUSTER
    elif args.topic is not None:
        resource, name = ResourceType.TOPIC, args.topic
    else:
        resource, name = ResourceType.GROUP, args.group
    return [
        Acl(principal=args.principal, resource_type=resource, name=name, operation=Operation(op))
        for op in args.operation
    ]


def _print_acls(acls: Iterable[Acl]) -> None:
    for acl in sorted(acls):
        print(f"{acl.principal}\t{acl.operation.value}\t{acl.resource_type.value}\t{acl.name}")


def _check_present(rules: Iterable[Acl], in_force: Iterable[Acl]) -> None:
    missing = set(rules) - set(in_force)
    if missing:
        raise ValueError(f"no such rule: {min(missing)}")


def _principal(text: str) -> str:
    try:
        return parse_principal(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_store_options(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    add_bootstrap_option(where)
    where.add_argument(
        "--data-dir",
        type=Path,
        help="offline, for a cluster's first super user: the embedded store of a stopped broker",
    )
    where.add_argument(
        "--zookeeper",
        metavar="HOST:PORT[,...][/CHROOT]",
        help="offline, for a cluster's first super user: the cluster's ZooKeeper",
    )
    add_zookeeper_auth_options(parser)
    add_client_options(parser)


def _offline(args: argparse.Namespace) -> bool:
    return args.data_dir is not None or args.zookeeper is not None


@asynccontextmanager
async def _store(args: argparse.Namespace) -> AsyncIterator[SecurityStore]:
    if args.zookeeper is not None:
        async with open_zookeeper_store(args.zookeeper, auth=zookeeper_auth(args)) as store:
            yield store
        return
    async with AsyncExitStack() as stack:
        try:
            embedded = await stack.enter_async_context(
                open_embedded_store(args.data_dir / "metadata")
            )
        except StoreUnavailable as exc:
            if not isinstance(exc.__cause__, BlockingIOError):
                raise
            raise StoreUnavailable(
                f"a running broker holds {args.data_dir}: ask it with --bootstrap HOST:PORT "
                "(as a user that may alter the cluster), or stop it first"
            ) from exc
        yield embedded


def _new_password(args: argparse.Namespace) -> str:
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        otherwise = "pass --password-stdin and the password as stdin's first line"
        password = _prompt(f"password for {args.name}: ", otherwise)
        if _prompt("again: ", otherwise) != password:
            raise ValueError("the passwords differ")
    if not password:
        raise ValueError("an empty password")
    return password


async def run_users(args: argparse.Namespace) -> None:
    password = _new_password(args) if args.verb == "add" else None
    mechanisms = (args.mechanism or MECHANISMS) if args.verb == "add" else ()
    if _offline(args):
        async with _store(args) as store:
            if password is not None:
                for mechanism in mechanisms:
                    await store.set_scram_credential(
                        args.name, make_credential(mechanism, password)
                    )
            elif args.verb == "delete":
                if not await store.delete_user(args.name):
                    raise ValueError(f"no user {args.name!r}")
            else:
                _print_users(await store.users())
        return
    async with open_admin(args.bootstrap, security=client_security(args)) as admin:
        if password is not None:
            await admin.set_password(args.name, password, mechanisms)
        elif args.verb == "delete":
            await admin.delete_user(args.name)
        else:
            _print_users({user: sorted(found) for user, found in (await admin.users()).items()})


def _print_users(users: Mapping[str, Iterable[str]]) -> None:
    for name, mechanisms in users.items():
        print(f"{name}\t{','.join(mechanisms)}")


def _endpoint(text: str) -> Endpoint:
    try:
        return Endpoint.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
