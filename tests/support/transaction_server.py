"""A FHIR server for the write-back tests, served over real HTTP on 127.0.0.1 (a thread): the
Bulk Data test server's SMART Backend Services (`tests.support.bulk_server`: its
`.well-known/smart-configuration` and token endpoint) and `POST /fhir` with a transaction Bundle,
processed as FHIR R4 says (http.html#transaction):

- every resource is validated with `fhir.resources`' R4B models (an invalid one: 400 with an
  OperationOutcome, nothing stored);
- `POST` with `ifNoneExist: identifier=system|value`: 200 and the resource found when one of that
  type has the identifier (conditional create; the value form-decoded, then read with FHIR's
  search escaping: `search_tokens`), else 201 and a new id; `PUT Type/id`: 200 when it exists
  (updated), else 201 (update as create);
- references to an entry's `fullUrl` are rewritten to the resource created or found;
- all or nothing; more than `max_entries` entries: 400;
- the token's SMART scopes must grant each entry's write (`system/<type>.c` for a `POST`,
  `.u` for a `PUT`; SMART v1 `.write` and `.*` too): 403 otherwise, nothing stored.

`redirect_to` makes it answer every transaction with a 307 to that URL. Every request is logged
as the Bulk Data server logs it (`requests`: method, path, whether it carried a valid token, its
headers); `transactions` holds each transaction Bundle's number of entries.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import unquote_plus, urlsplit

from fhir.resources.R4B import get_fhir_model_class
from pydantic import ValidationError

from tests.support.bulk_server import BulkServer, outcome
from tests.support.bulk_server import _handler as bulk_handler
from tests.support.http_thread import serving_in_thread


@dataclass
class TransactionServer(BulkServer):
    """The store and switches (see the module docstring)."""

    max_entries: int = 1000
    redirect_to: str | None = None
    store: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    transactions: list[int] = field(default_factory=list)
    """The entries of each transaction Bundle received."""
    scopes: dict[str, str] = field(default_factory=dict)
    """token -> the scopes it was issued with."""

    def issue(self, form: dict[str, str]) -> tuple[int, dict[str, Any]]:
        """The token endpoint's answer, each token's scopes kept."""
        status, body = super().issue(form)
        if status == 200:
            with self.lock:
                self.scopes[body["access_token"]] = body["scope"]
        return status, body

    def refused_write(self, authorization: str | None, bundle: Any) -> str | None:
        """The first write of `bundle` the token's scopes do not grant (None: all granted)."""
        token = (authorization or "").removeprefix("Bearer ")
        granted: dict[str, str] = {}
        for scope in self.scopes.get(token, "").split():
            kind, _, permissions = scope.removeprefix("system/").partition(".")
            granted[kind] = granted.get(kind, "") + {"write": "cu", "*": "cruds"}.get(
                permissions, permissions
            )
        for entry in (bundle or {}).get("entry") or []:
            kind = (entry.get("resource") or {}).get("resourceType", "")
            needed = "u" if (entry.get("request") or {}).get("method") == "PUT" else "c"
            if needed not in granted.get(kind, "") + granted.get("*", ""):
                return f"system/{kind}.{needed}"
        return None

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        """The stored resources of one type."""
        return [r for (k, _), r in sorted(self.store.items()) if k == kind]

    def _find(self, kind: str, condition: str) -> str | None:
        """The id of the resource of `kind` the query `condition` finds: every `identifier`
        parameter matched by one of the resource's identifiers (other parameters ignored, as a
        lenient server does)."""
        params = [part.partition("=") for part in condition.split("&")]
        searches = [
            set(search_tokens(unquote_plus(value)))
            for name, _, value in params
            if unquote_plus(name) == "identifier"
        ]
        if not searches:
            raise ValueError(f"unsupported condition {condition!r}")
        for (k, rid), resource in self.store.items():
            pairs = {(i.get("system"), i.get("value")) for i in resource.get("identifier", [])}
            pairs |= {(None, value) for _, value in pairs}
            if k == kind and all(pairs & wanted for wanted in searches):
                return rid
        return None

    def transaction(self, bundle: Any) -> tuple[int, dict[str, Any]]:
        """The transaction-response of a Bundle (or an error and its OperationOutcome)."""
        if not isinstance(bundle, dict) or bundle.get("type") != "transaction":
            return 400, outcome("error", "invalid", "not a transaction Bundle")
        entries = bundle.get("entry") or []
        if len(entries) > self.max_entries:
            return 400, outcome("error", "too-costly", f"more than {self.max_entries} entries")
        try:
            get_fhir_model_class("Bundle").model_validate(bundle)
            for entry in entries:
                resource = entry["resource"]
                get_fhir_model_class(resource["resourceType"]).model_validate(resource)
        except (ValidationError, KeyError) as exc:
            return 400, outcome("error", "invalid", str(exc)[:2000])
        with self.lock:
            return 200, self._apply(entries)

    def _apply(self, entries: list[dict[str, Any]]) -> dict[str, Any]:
        placed: dict[str, str] = {}
        plan = []
        for entry in entries:
            resource, request = entry["resource"], entry["request"]
            kind = resource["resourceType"]
            if request["method"] == "PUT":
                rid = request["url"].split("/", 1)[1]
                status = "200 OK" if (kind, rid) in self.store else "201 Created"
            else:
                condition = request.get("ifNoneExist")
                found = self._find(kind, condition) if condition else None
                rid = found or secrets.token_hex(8)
                status = "200 OK" if found else "201 Created"
            placed[entry["fullUrl"]] = f"{kind}/{rid}"
            plan.append((kind, rid, status, resource))
        response = []
        for kind, rid, status, resource in plan:
            if status.startswith("201") or resource.get("id") == rid:
                stored = _rewrite(resource, placed) | {"id": rid}
                self.store[(kind, rid)] = stored
            response.append({"response": {"status": status, "location": f"{kind}/{rid}"}})
        return {"resourceType": "Bundle", "type": "transaction-response", "entry": response}


def search_tokens(text: str) -> list[tuple[str | None, str]]:
    """A token search's (system, value) alternatives as a FHIR R4 server reads the parameter's
    (form-decoded) value: alternatives split at each unescaped `,`, system and value at the first
    unescaped `|` (no `|`: None, any system), each `\\` dropped before the character it escapes."""
    alternatives: list[tuple[str | None, str]] = []
    system: str | None = None
    current: list[str] = []
    chars = iter(text + ",")
    for char in chars:
        if char == "\\":
            current.append(next(chars, ""))
        elif char == "|" and system is None:
            system, current = "".join(current), []
        elif char == ",":
            alternatives.append((system, "".join(current)))
            system, current = None, []
        else:
            current.append(char)
    return alternatives


def _rewrite(value: Any, placed: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {
            k: (placed.get(v, v) if k == "reference" else _rewrite(v, placed))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_rewrite(v, placed) for v in value]
    return value


def _handler(server: TransactionServer) -> type[BaseHTTPRequestHandler]:
    class Handler(bulk_handler(server)):  # type: ignore[misc]
        """The Bulk Data server's handler (token endpoint, SMART configuration, `_send`,
        `_log`) with transactions at `POST /fhir`."""

        def do_POST(self) -> None:
            if urlsplit(self.path).path != "/fhir":
                super().do_POST()
                return
            valid = self._log()
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            try:
                bundle = json.loads(body)
            except ValueError:
                bundle = None
            if isinstance(bundle, dict):
                with server.lock:
                    server.transactions.append(len(bundle.get("entry") or []))
            refused = server.refused_write(self.headers.get("Authorization"), bundle)
            if not valid:
                self._send(401, outcome("error", "login", "a valid token is required"))
            elif isinstance(bundle, dict) and refused is not None:
                self._send(403, outcome("error", "forbidden", f"the token lacks {refused}"))
            elif server.redirect_to is not None:
                self._send(307, None, {"Location": server.redirect_to})
            else:
                self._send(*server.transaction(bundle))

    return Handler


@contextmanager
def serving_transactions(server: TransactionServer) -> Iterator[TransactionServer]:
    """`server` on 127.0.0.1 (a free port) while the block runs; `server.url` is set."""
    with serving_in_thread(_handler(server)) as http:
        server.url = f"http://127.0.0.1:{http.server_address[1]}"
        yield server
