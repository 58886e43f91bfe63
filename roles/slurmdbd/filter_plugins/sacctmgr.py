"""What sacctmgr must add or change so the accounting database holds the spec's accounts and users.

Reads `sacctmgr -n -P` listings (one record a line, fields separated by '|') and returns the sacctmgr
command lines (argv lists, `-i`: commit without asking) that are missing; nothing when the database already
agrees, so the converge reports changed only when something is added or changed. Accounts or users that are
in the database and not in the spec are left alone (accounting data is never deleted by a converge).

    accounts: sacctmgr -n -P list account format=Account,Descr,Org
    assocs:   sacctmgr -n -P list association cluster=<name> format=Account,User,ParentName
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def _records(text: str, fields: int) -> list[list[str]]:
    out = []
    for line in (text or "").splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        out.append((parts + [""] * fields)[:fields])
    return out


def slurmdbd_account_commands(
    accounts_out: str, assocs_out: str, accounts: Iterable[Mapping[str, Any]], cluster: str
) -> list[dict[str, Any]]:
    """[{why, argv}] in the order they must run (an account's parent before it, accounts before users)."""
    known = {name: (descr, org) for name, descr, org in _records(accounts_out, 3)}
    parents: dict[str, str] = {}
    members: set[tuple[str, str]] = set()
    for account, user, parent in _records(assocs_out, 3):
        if user:
            members.add((account, user))
        else:
            parents[account] = parent
    out: list[dict[str, Any]] = []
    for acct in accounts:
        name = str(acct["name"])
        parent = str(acct.get("parent") or "root")
        descr, org = str(acct.get("description") or ""), str(acct.get("organization") or "")
        fields = ([f"description={descr}"] if descr else []) + ([f"organization={org}"] if org else [])
        if name not in parents:
            out.append(
                {
                    "why": f"add account {name} (parent {parent}) to cluster {cluster}",
                    "argv": [
                        "sacctmgr",
                        "-i",
                        "add",
                        "account",
                        name,
                        f"cluster={cluster}",
                        f"parent={parent}",
                        *fields,
                    ],
                }
            )
        else:
            have_descr, have_org = known.get(name, ("", ""))
            # sacctmgr stores descriptions and organizations in lowercase
            changes = ([f"description={descr}"] if descr and descr.lower() != have_descr.lower() else []) + (
                [f"organization={org}"] if org and org.lower() != have_org.lower() else []
            )
            if changes:
                out.append(
                    {
                        "why": f"set {', '.join(c.split('=', 1)[0] for c in changes)} of account {name}",
                        "argv": [
                            "sacctmgr",
                            "-i",
                            "modify",
                            "account",
                            "where",
                            f"name={name}",
                            "set",
                            *changes,
                        ],
                    }
                )
            if parents[name] != parent:
                out.append(
                    {
                        "why": f"move account {name} from parent {parents[name] or '-'} to {parent}",
                        "argv": [
                            *("sacctmgr", "-i", "modify", "account", "where", f"name={name}"),
                            *(f"cluster={cluster}", "set", f"parent={parent}"),
                        ],
                    }
                )
    for acct in accounts:
        name = str(acct["name"])
        for user in acct.get("users") or []:
            if (name, str(user)) not in members:
                out.append(
                    {
                        "why": f"add user {user} to account {name} on cluster {cluster}",
                        "argv": [
                            "sacctmgr",
                            "-i",
                            "add",
                            "user",
                            str(user),
                            f"account={name}",
                            f"cluster={cluster}",
                        ],
                    }
                )
    return out


class FilterModule:
    def filters(self) -> dict[str, object]:
        return {"slurmdbd_account_commands": slurmdbd_account_commands}
