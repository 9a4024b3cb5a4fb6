"""A mypy plugin: a misspelt key in ``answer.get("key")`` on a protocol TypedDict is an error.

mypy checks ``answer["key"]`` against the TypedDict but lets ``answer.get("key")`` through
(it returns ``object``), and the control side reads most optional answer keys with ``.get``:
that is how ``status`` once read ``matches_spec`` where the engine wrote ``matches``. This
hook reports a literal key the TypedDict does not declare, with the same message and error
code mypy uses for a subscript, then leaves the typing to mypy's own ``get`` callback.

Enabled in pyproject.toml ([tool.mypy] plugins); run by ``.ci/run``, beside which it lives. Not part of the
package: nothing of provision imports it.
"""

from __future__ import annotations

from typing import Callable

from mypy.errorcodes import TYPEDDICT_ITEM
from mypy.plugin import MethodContext, Plugin
from mypy.plugins.default import typed_dict_get_callback
from mypy.typeops import try_getting_str_literals
from mypy.types import Type, TypedDictType


def _checked_get(ctx: MethodContext) -> Type:
    td = ctx.type
    if isinstance(td, TypedDictType) and ctx.args and len(ctx.args[0]) == 1:
        keys = try_getting_str_literals(ctx.args[0][0], ctx.arg_types[0][0]) or []
        name = td.fallback.type.name if td.fallback and td.fallback.type else "TypedDict"
        for key in keys:
            if key not in td.items:
                ctx.api.fail(f'TypedDict "{name}" has no key "{key}"', ctx.context, code=TYPEDDICT_ITEM)
    return typed_dict_get_callback(ctx)


class TypedDictGetPlugin(Plugin):
    def get_method_hook(self, fullname: str) -> Callable[[MethodContext], Type] | None:
        return _checked_get if fullname == "typing.Mapping.get" else None


def plugin(version: str) -> type[Plugin]:
    return TypedDictGetPlugin
