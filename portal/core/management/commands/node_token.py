"""``manage.py node_token``: the credentials node agents sync with.

    python manage.py node_token create gpu-1 [--file /etc/cosched/gpu-1.token]
    python manage.py node_token list
    python manage.py node_token revoke gpu-1

``create`` prints the new key once (or writes it to ``--file``, mode 0600, and prints only its
prefix); only its SHA-256 is stored. The agent reads it with ``--token-file``. A node may hold
several active tokens (rotation: create a new one, restart the agent with it, revoke the old:
``revoke gpu-1 --keep-newest``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from portal.core.models import NodeToken
from portal.core.nodes import node_token_create, node_token_revoke


class Command(BaseCommand):
    help = "Create, list or revoke the tokens node agents sync with."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="a new token for one node")
        create.add_argument("node", help="the node's name (the agent's --name)")
        create.add_argument("--file", help="write the key to this file (mode 0600)")
        sub.add_parser("list", help="every token: node, prefix, created, last used, revoked")
        revoke = sub.add_parser("revoke", help="revoke a node's active tokens")
        revoke.add_argument("node")
        revoke.add_argument(
            "--keep-newest", action="store_true", help="keep the most recent one (rotation)"
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        action = opts["action"]
        if action == "create":
            try:
                token, key = node_token_create(opts["node"])
            except ValueError as exc:
                raise CommandError(str(exc)) from None
            if opts["file"]:
                path = Path(opts["file"])
                path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(key + "\n")
                os.chmod(path, 0o600)
                self.stdout.write(f"token {token.prefix}… for node {token.node_name} in {path}")
            else:
                self.stdout.write(key)
        elif action == "list":
            for t in NodeToken.objects.all():
                revoked = f"revoked {t.revoked_at:%Y-%m-%d %H:%M}" if t.revoked_at else "active"
                used = f"{t.last_used_at:%Y-%m-%d %H:%M}" if t.last_used_at else "never"
                self.stdout.write(
                    f"{t.node_name}\t{t.prefix}…\tcreated {t.created_at:%Y-%m-%d %H:%M}"
                    f"\tlast used {used}\t{revoked}"
                )
        else:
            keep = None
            if opts["keep_newest"]:
                keep = NodeToken.objects.filter(node_name=opts["node"], revoked_at=None).first()
            count = node_token_revoke(opts["node"], keep=keep)
            self.stdout.write(f"revoked {count} token(s) of node {opts['node']}")
