"""Request and response shapes. Requests are strict: an unknown field is a 400 naming it.

Money is a decimal string in both directions (``"30"``, ``"0.0004"``); a JSON float is refused,
as everywhere in this app. Serializers check shapes only; the services check meaning.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import threading
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from django.core.validators import RegexValidator
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from llm_budgets import validation
from llm_budgets.conf import conf
from llm_budgets.exceptions import BudgetError, BudgetExceeded, InvalidUsage, Wire
from llm_budgets.models import Budget, Price, Reservation, Window
from llm_budgets.models.budgets import MAX_STRIPES
from llm_budgets.money import DECIMAL_PLACES, MAX_DIGITS
from llm_budgets.request import Request

# Identifiers as the schema states them: non-empty, no white space at either end. The server also
# normalises (NFKC) and refuses invisible characters: see validation.identifier.
IDENTIFIER_PATTERN = r"^\S(.*\S)?$"

MONEY_SCHEMA = {
    "type": "string",
    "format": "decimal",
    "pattern": r"^[0-9]+(\.[0-9]+)?$",
    "example": "30.00",
}


@extend_schema_field(MONEY_SCHEMA)
class MoneyField(serializers.Field):
    """A non-negative decimal amount: a string or an integer, never a float."""

    def to_internal_value(self, data: Any) -> Decimal:
        try:
            amount = validation.money(self.field_name or "amount", data)
        except InvalidUsage as exc:
            raise serializers.ValidationError(exc.message) from None
        assert amount is not None
        return amount

    def to_representation(self, value: Decimal) -> str:
        return format(value.normalize(), "f")


class IdentifierField(serializers.CharField):
    """An id (tenant, end user, provider, model, idempotency key): a string only (a number is
    refused, not turned into its digits), in canonical form (``validation.identifier``)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_length", 255)
        kwargs.setdefault("min_length", 1)
        kwargs["trim_whitespace"] = False
        super().__init__(**kwargs)
        # States the shape in the schema; the canonical value never fails it.
        self.validators.append(RegexValidator(IDENTIFIER_PATTERN))

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        try:
            return validation.identifier(
                self.field_name or "id", data, max_length=self.max_length or 255
            )
        except InvalidUsage as exc:
            raise serializers.ValidationError(exc.message) from None


class WholeNumberField(serializers.IntegerField):
    """An integer: a JSON integer, or a string of ASCII digits (a query parameter). Refuses
    ``10.0``, ``1e3``, ``" 10 "``, ``"1_000"`` and Arabic-Indic digits, which DRF's
    ``IntegerField`` takes.
    ``maximum`` may be a callable read at validation time (a setting)."""

    def __init__(self, *, maximum: Any = None, **kwargs: Any) -> None:
        self.maximum = maximum
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> int:
        try:
            value = validation.whole_number(self.field_name or "value", data)
        except InvalidUsage as exc:
            raise serializers.ValidationError(exc.message) from None
        limit = self.maximum() if callable(self.maximum) else self.maximum
        if limit is not None and value > limit:
            raise serializers.ValidationError(
                f"Ensure this value is less than or equal to {limit}."
            )
        return value


def ttl_field(**kwargs: Any) -> WholeNumberField:
    return WholeNumberField(min_value=1, maximum=lambda: conf.MAX_TTL_SECONDS, **kwargs)


def money_out(**kwargs: Any) -> serializers.DecimalField:
    """A read-only amount, normalized (``"30"``, not ``"30.0000000000"``)."""
    return serializers.DecimalField(
        max_digits=MAX_DIGITS,
        decimal_places=DECIMAL_PLACES,
        normalize_output=True,
        read_only=True,
        **kwargs,
    )


def _fresh(field: serializers.Field) -> serializers.Field:
    """A copy of an unbound declared field, as DRF's ``copy.deepcopy`` makes one per serializer
    instance, without re-running ``__init__`` (most of a request serializer's cost: validators
    built again, kwargs deep-copied). What a field may change after ``__init__`` is copied: its
    validators list, its binding (done by the serializer), its child (re-parented to the copy); the
    rest (error messages, help text, kwargs) is only read."""
    if isinstance(field, serializers.BaseSerializer):
        return copy.deepcopy(field)
    new = copy.copy(field)
    state = new.__dict__  # DRF's attributes, undeclared for the type checker
    if "_validators" in state:
        state["_validators"] = list(state["_validators"])
    child = state.get("child")
    if child is not None:
        state["child"] = _fresh(child)
        state["child"].parent = new  # bound by the field's __init__ (field_name ""): re-parent
    return new


class StrictSerializer(serializers.Serializer):
    """Refuses fields it does not know, so a typo is an error, not a silent default."""

    # Fields clients may expect from the spec that are not supported yet: the message says why.
    not_yet: dict[str, str] = {}

    def get_fields(self) -> dict[str, serializers.Field]:
        return {name: _fresh(field) for name, field in self._declared_fields.items()}

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError(
                    {name: [self.not_yet.get(name, f"Unknown field {name!r}.")] for name in unknown}
                )
        return super().to_internal_value(data)


def idempotency_key_field() -> serializers.CharField:
    return IdentifierField(
        required=False,
        help_text="Same as the Idempotency-Key header (send either).",
    )


def messages_field() -> serializers.ListField:
    return serializers.ListField(
        child=serializers.DictField(),
        required=False,
        allow_empty=False,
        help_text='Chat messages ({"role", "content", "name"?}) whose input tokens the server '
        "counts (tiktoken for OpenAI-family models, a conservative bound for others). Give "
        "input_tokens, or messages, or prompt.",
    )


class TextField(serializers.CharField):
    """Text only: a number is refused, not turned into its digits (a prompt of "12" is not 12)."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


def prompt_field() -> serializers.CharField:
    return TextField(
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        help_text="Prompt text whose input tokens the server counts, instead of input_tokens.",
    )


def max_tool_calls_field() -> serializers.DictField:
    return serializers.DictField(
        child=WholeNumberField(min_value=0),
        required=False,
        help_text='Server-side tool calls the request may make, e.g. {"web_search": 3}: their '
        "fees are added to the worst case.",
    )


def call_request(
    data: Mapping[str, Any], *, tenant: str, idempotency_key: str | None = None
) -> Request:
    """The :class:`~llm_budgets.request.Request` a reservation's body or a quote's query
    parameters describe (``validated_data`` of :class:`ReserveRequestSerializer` or
    :class:`QuoteQuerySerializer`): the wire's ``ttl_seconds`` is the request's ``ttl``; the
    tenant is the one the key resolved. The service checks it (``Request.checked``)."""
    return Request(
        tenant=tenant,
        end_user=data.get("end_user"),
        provider=data.get("provider"),
        model=data["model"],
        input_tokens=data.get("input_tokens"),
        messages=data.get("messages"),
        prompt=data.get("prompt"),
        max_output_tokens=data.get("max_output_tokens"),
        max_tool_calls=data.get("max_tool_calls"),
        ttl=data.get("ttl_seconds"),
        tags=data.get("tags"),
        run=data.get("run"),
        allow_degrade=data.get("allow_degrade", False),
        idempotency_key=idempotency_key,
    )


class ReserveRequestSerializer(StrictSerializer):
    tenant = IdentifierField(
        required=False,
        max_length=255,
        help_text="The tenant's external id. Implied by a tenant key; required with an operator "
        "key.",
    )
    end_user = IdentifierField(required=False, allow_null=True, max_length=255)
    provider = IdentifierField(
        required=False,
        allow_null=True,
        max_length=64,
        help_text="May be left out when exactly one provider prices the model.",
    )
    model = IdentifierField(max_length=128)
    input_tokens = WholeNumberField(
        min_value=0,
        required=False,
        help_text="All input tokens, cached ones included. Or send messages or prompt instead.",
    )
    messages = messages_field()
    prompt = prompt_field()
    max_output_tokens = WholeNumberField(
        min_value=1,
        required=False,
        allow_null=True,
        help_text="Output ceiling; may be omitted only if the tenant's plan sets a default.",
    )
    max_tool_calls = max_tool_calls_field()
    tags = serializers.DictField(
        child=TextField(allow_blank=True, trim_whitespace=False),
        required=False,
        help_text='Your string tags, e.g. {"feature": "chat"} (at most 16; names up to 64 '
        "characters, values up to 256), kept on the reservation and copied onto its ledger "
        "lines.",
    )
    run = IdentifierField(
        required=False,
        max_length=255,
        help_text="The agent run the call belongs to, e.g. run-42: its budgets (and the tenant's "
        'run="*" budget, on a counter of its own) apply until the run is closed.',
    )
    ttl_seconds = ttl_field(
        required=False,
        help_text="Hold lifetime; default DEFAULT_TTL_SECONDS, at most MAX_TTL_SECONDS.",
    )
    allow_degrade = serializers.BooleanField(
        required=False,
        default=False,
        help_text="Let the plan's degradation ladder grant a cheaper model or a lower output "
        "ceiling as budgets fill; the response says what was granted.",
    )
    idempotency_key = idempotency_key_field()


class ReservationSerializer(serializers.ModelSerializer[Reservation]):
    tenant = serializers.CharField(source="tenant.external_id", read_only=True)
    end_user = serializers.CharField(
        source="end_user.external_id", read_only=True, allow_null=True, default=None
    )
    amount = money_out(help_text="The hold: the call's worst-case cost.")
    tags = serializers.DictField(child=serializers.CharField(), read_only=True)

    class Meta:
        model = Reservation
        fields = [
            "id",
            "state",
            "tenant",
            "end_user",
            "provider",
            "model",
            "input_tokens",
            "max_output_tokens",
            "amount",
            "currency",
            "degraded",
            "requested_model",
            "tags",
            "idempotency_key",
            "created_at",
            "expires_at",
            "settled_at",
        ]
        read_only_fields = fields


def usage_count(help_text: str) -> WholeNumberField:
    return WholeNumberField(min_value=0, required=False, default=0, help_text=help_text)


class CommitRequestSerializer(StrictSerializer):
    """Usage in the public convention (``llm_budgets.usage``): input_tokens counts all input,
    cache reads and writes included; output_tokens includes reasoning."""

    input_tokens = WholeNumberField(
        min_value=0, help_text="All input tokens, cache reads and writes included."
    )
    output_tokens = WholeNumberField(
        min_value=0, help_text="All output tokens, reasoning included."
    )
    cached_input_tokens = usage_count("How many of input_tokens were cache reads.")
    cache_write_tokens = usage_count("How many of input_tokens were cache writes.")
    cache_write_1h_tokens = usage_count("How many of the cache writes used the 1-hour cache.")
    reasoning_tokens = usage_count("How many of output_tokens were reasoning.")
    tool_calls = serializers.DictField(
        child=WholeNumberField(min_value=0),
        required=False,
        help_text='Calls of server-side tools, e.g. {"web_search": 2}.',
    )
    idempotency_key = idempotency_key_field()


class CommitResultSerializer(serializers.Serializer):
    id = serializers.UUIDField(source="reservation_id", read_only=True)
    state = serializers.CharField(read_only=True)
    cost = money_out(help_text="What the call cost, at the reservation's price version.")
    reserved = money_out()
    overage = money_out(help_text="Cost above the hold; zero when the hold covered it.")
    currency = serializers.CharField(read_only=True)
    customer_cost = money_out(help_text="The cost at customer price (with the tenant's markup).")
    pricing_basis = serializers.CharField(
        read_only=True, help_text='"price", or the unknown-model policy that set the cost.'
    )


class EmptyRequestSerializer(StrictSerializer):
    idempotency_key = idempotency_key_field()


class ExtendRequestSerializer(StrictSerializer):
    ttl_seconds = ttl_field(
        help_text="The hold now expires this many seconds from now (never earlier); at most "
        "MAX_TTL_SECONDS."
    )
    idempotency_key = idempotency_key_field()


class BudgetStatusSerializer(serializers.Serializer):
    budget_id = serializers.IntegerField(read_only=True)
    scope = serializers.CharField(read_only=True)
    scope_label = serializers.CharField(read_only=True)
    window = serializers.CharField(read_only=True)
    limit = money_out()
    spent = money_out()
    reserved = money_out()
    remaining = money_out()
    currency = serializers.CharField(read_only=True)
    unit = serializers.CharField(read_only=True, help_text="provider_cost or customer_price.")
    period_start = serializers.DateTimeField(read_only=True)
    resets_at = serializers.DateTimeField(read_only=True, allow_null=True)
    raised = money_out(help_text="Active temporary raises, included in limit.")
    projected = money_out(
        allow_null=True,
        help_text="Monthly budgets of the tenant or an end user: spent + reserved projected at "
        "the end of the period from the recent burn rate (docs/pages.md, Projections); null "
        "where there is none (other windows, no complete day of usage yet).",
    )
    runs_out_at = serializers.DateTimeField(
        read_only=True,
        allow_null=True,
        help_text="When the budget would reach its limit at that rate, if before it resets.",
    )


class TenantStatusSerializer(serializers.Serializer):
    tenant = serializers.CharField(read_only=True)
    end_user = serializers.CharField(read_only=True, allow_null=True)
    budgets = BudgetStatusSerializer(many=True, read_only=True)


class BudgetSerializer(serializers.ModelSerializer[Budget]):
    tenant = serializers.CharField(
        source="tenant.external_id", read_only=True, allow_null=True, default=None
    )
    end_user = serializers.CharField(
        source="end_user.external_id", read_only=True, allow_null=True, default=None
    )
    api_key = serializers.CharField(
        source="api_key.prefix", read_only=True, allow_null=True, default=None
    )
    run = serializers.CharField(
        source="run.external_id", read_only=True, allow_null=True, default=None
    )
    tag = serializers.SerializerMethodField()
    limit = money_out()

    def get_tag(self, budget: Budget) -> dict[str, str] | None:
        return {budget.tag_key: budget.tag_value} if budget.tag_key else None

    class Meta:
        model = Budget
        fields = [
            "id",
            "scope",
            "scope_label",
            "tenant",
            "end_user",
            "api_key",
            "run",
            "tag",
            "window",
            "limit",
            "currency",
            "hot",
            "stripes",
            "updated_at",
        ]
        read_only_fields = fields


class SetLimitRequestSerializer(StrictSerializer):
    tenant = IdentifierField(required=False, max_length=255, help_text="Omit for the global cap.")
    end_user = IdentifierField(
        required=False, max_length=255, help_text='"*" for the default of each end user.'
    )
    api_key = serializers.CharField(
        required=False, max_length=255, help_text='An API key\'s prefix, or "*" for each key.'
    )
    run = IdentifierField(
        required=False, max_length=255, help_text='A run id, or "*" for each run.'
    )
    tag = serializers.ListField(
        child=serializers.CharField(max_length=256),
        min_length=2,
        max_length=2,
        required=False,
        help_text='A tag as [key, value], e.g. ["project", "alpha"].',
    )
    window = serializers.ChoiceField(choices=Window.choices)
    amount = MoneyField()
    hot = serializers.BooleanField(
        required=False,
        help_text="Split the budget's counter into stripes so admissions under it do not all "
        "lock one row (docs/limits.md, Hot caps). Omit to leave it as it is.",
    )
    stripes = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_STRIPES,
        help_text="How many stripes a hot budget's counter is split into (default 8).",
    )
    reason = serializers.CharField(required=False, default="", allow_blank=True, max_length=1000)
    idempotency_key = idempotency_key_field()


class RunCloseRequestSerializer(StrictSerializer):
    tenant = serializers.CharField(
        required=False,
        max_length=255,
        help_text="The tenant's external id. Implied by a tenant key; required with an operator "
        "key.",
    )
    run = IdentifierField(max_length=255, help_text="The run to close, e.g. run-42.")
    reason = serializers.CharField(required=False, default="", allow_blank=True, max_length=1000)
    idempotency_key = idempotency_key_field()


class RunSerializer(serializers.Serializer):
    tenant = serializers.CharField(source="tenant.external_id", read_only=True)
    run = serializers.CharField(source="external_id", read_only=True)
    closed_at = serializers.DateTimeField(read_only=True, allow_null=True)


class PriceSerializer(serializers.ModelSerializer[Price]):
    input_per_mtok = money_out()
    cached_input_per_mtok = money_out(allow_null=True)
    cache_write_per_mtok = money_out(allow_null=True)
    output_per_mtok = money_out()
    per_request = money_out()

    class Meta:
        model = Price
        fields = [
            "id",
            "provider",
            "model",
            "input_per_mtok",
            "cached_input_per_mtok",
            "cache_write_per_mtok",
            "output_per_mtok",
            "per_request",
            "currency",
            "effective_from",
            "effective_to",
            "source",
        ]
        read_only_fields = fields


@extend_schema_field({"type": "string", "description": "JSON text"})
class JsonTextField(serializers.Field):
    """A JSON document sent as text (a query parameter), parsed to ``expected``."""

    def __init__(self, *, expected: type, example: str, **kwargs: Any) -> None:
        self.expected = expected
        self.example = example
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> Any:
        try:
            value = json.loads(data) if isinstance(data, str) else None
        except ValueError:
            value = None
        if not isinstance(value, self.expected):
            kind = "array" if self.expected is list else "object"
            raise serializers.ValidationError(
                f"Must be a JSON {kind} sent as text, e.g. {self.example}."
            )
        return value


class QuoteQuerySerializer(StrictSerializer):
    """``GET /quote``'s query parameters: a reservation request, without holding anything."""

    tenant = IdentifierField(
        required=False,
        max_length=255,
        help_text="The tenant's external id. Implied by a tenant key; required with an operator "
        "key.",
    )
    end_user = IdentifierField(
        required=False, max_length=255, help_text="Include this end user's budgets."
    )
    provider = IdentifierField(
        required=False,
        max_length=64,
        help_text="May be left out when exactly one provider prices the model.",
    )
    model = IdentifierField(max_length=128)
    input_tokens = WholeNumberField(
        min_value=0,
        required=False,
        help_text="All input tokens, cached ones included. Or send messages or prompt instead.",
    )
    messages = JsonTextField(
        expected=list,
        example='[{"role": "user", "content": "Hello"}]',
        required=False,
        help_text="Chat messages as JSON text, counted by the server instead of input_tokens.",
    )
    prompt = prompt_field()
    max_output_tokens = WholeNumberField(
        min_value=1,
        required=False,
        help_text="Output ceiling; may be omitted only if the tenant's plan sets a default.",
    )
    max_tool_calls = JsonTextField(
        expected=dict,
        example='{"web_search": 3}',
        required=False,
        help_text='Tool calls the request may make, as JSON text, e.g. {"web_search": 3}.',
    )
    ttl_seconds = ttl_field(
        required=False,
        help_text="The hold's lifetime, for time-of-day prices; default DEFAULT_TTL_SECONDS, at "
        "most MAX_TTL_SECONDS.",
    )
    run = IdentifierField(required=False, max_length=255, help_text="Include this run's budgets.")
    tags = JsonTextField(
        expected=dict,
        example='{"project": "alpha"}',
        required=False,
        help_text="Include these tags' budgets, as JSON text.",
    )


class QuoteItemSerializer(serializers.Serializer):
    dimension = serializers.CharField(
        read_only=True,
        help_text="The price dimension, e.g. output_per_mtok or per_request; input_tolerance: "
        "the input a commit may report beyond the held count, at the input rate.",
    )
    quantity = serializers.IntegerField(read_only=True, help_text="Tokens, or calls.")
    rate = MoneyField(read_only=True, help_text="Per million tokens, or per call.")
    amount = MoneyField(read_only=True, help_text="quantity x rate, before rounding the hold.")


class BudgetDrawSerializer(serializers.Serializer):
    budget = BudgetStatusSerializer(source="status", read_only=True)
    would_hold = money_out(help_text="What the hold would be in this budget's unit.")
    fits = serializers.BooleanField(read_only=True, help_text="Whether it fits right now.")


class ModelMatchSerializer(serializers.Serializer):
    rule = serializers.CharField(
        read_only=True, help_text="exact, spelling, genai-prices or alias (docs/pricing.md)."
    )
    model = serializers.CharField(read_only=True, help_text="The priced model the name found.")
    detail = serializers.CharField(read_only=True, help_text="What the rule did, for a person.")


class QuoteSerializer(serializers.Serializer):
    tenant = serializers.CharField(read_only=True)
    end_user = serializers.CharField(read_only=True, allow_null=True)
    provider = serializers.CharField(read_only=True, allow_null=True)
    model = serializers.CharField(read_only=True)
    input_tokens = serializers.IntegerField(source="estimate.input_tokens", read_only=True)
    max_output_tokens = serializers.IntegerField(
        source="estimate.max_output_tokens",
        read_only=True,
        help_text="The output ceiling used: as asked, the plan's default, clamped to the model's.",
    )
    pricing_basis = serializers.CharField(
        source="estimate.pricing_basis",
        read_only=True,
        help_text='"price", or the unknown-model policy that priced it (price_as, fixed).',
    )
    price = PriceSerializer(
        source="estimate.price",
        read_only=True,
        allow_null=True,
        help_text="The price version in effect; null under the fixed-amount policy.",
    )
    model_match = ModelMatchSerializer(
        read_only=True,
        allow_null=True,
        help_text="How the model name found its price; null under the unknown-model policy.",
    )
    items = QuoteItemSerializer(source="estimate.items", many=True, read_only=True)
    amount = money_out(source="estimate.amount", help_text="The hold at provider cost.")
    markup_percent = money_out(source="estimate.markup_percent")
    customer_amount = money_out(
        source="estimate.customer_amount", help_text="The hold at customer price."
    )
    input_tolerance = money_out(
        source="estimate.input_tolerance",
        help_text="Of amount, the input tolerance: the input a commit may report beyond "
        "input_tokens (10% + 256 tokens), held too (item input_tolerance).",
    )
    customer_input_tolerance = money_out(
        source="estimate.customer_input_tolerance",
        help_text="Of customer_amount, the input tolerance.",
    )
    currency = serializers.CharField(read_only=True)
    budgets = BudgetDrawSerializer(many=True, read_only=True)
    admissible = serializers.BooleanField(
        read_only=True,
        help_text="Whether a reservation would be admitted now: every budget fits (and one "
        "applies). Budgets can move before you reserve.",
    )


def _wire_field(wire: Wire, *, nested: bool = False) -> serializers.Field:
    """The schema of one error attribute, from its ``Wire`` (``llm_budgets.exceptions``)."""
    kinds: dict[str, type[serializers.Field]] = {
        "int": serializers.IntegerField,
        "bool": serializers.BooleanField,
        "time": serializers.DateTimeField,
    }
    options: dict[str, Any] = {"help_text": wire.help or None}
    if nested:
        options["allow_null"] = wire.nullable
    else:
        options["required"] = False
    if wire.kind == "money":
        options["help_text"] = f"{wire.help} A decimal string.".strip()
    return kinds.get(wire.kind, serializers.CharField)(**options)


def _error_wires() -> dict[str, Wire]:
    """Every top-level attribute any error sends, by name; where several errors send one, its
    description says what it holds in each (by error code)."""
    found: dict[str, list[tuple[str, Wire]]] = {}
    pending: list[type[BudgetError]] = [BudgetError]
    while pending:
        cls = pending.pop(0)
        pending.extend(cls.__subclasses__())
        for wire in cls.__dict__.get("wire", ()):
            if len(wire.where) == 1:
                found.setdefault(wire.attr, []).append((cls.code, wire))
    result = {}
    for name, declared in found.items():
        wire = declared[0][1]
        helps = {f"{code}: {w.help}" for code, w in declared if w.help}
        if len(declared) > 1:
            wire = dataclasses.replace(wire, help=" ".join(sorted(helps)))
        result[name] = wire
    return result


class ErrorDetailSerializer(serializers.Serializer):
    code = serializers.CharField(help_text="Machine-readable, e.g. budget_exceeded.")
    message = serializers.CharField(help_text="What happened and what to do, for a person.")

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        # The attributes errors send beside code and message, as ``llm_budgets.exceptions``
        # declares them (``wire``): present when they apply.
        for name, wire in _error_wires().items():
            fields[name] = _wire_field(wire)
        # "fields" cannot be a class attribute: it would shadow Serializer.fields.
        fields["fields"] = serializers.DictField(
            child=serializers.ListField(child=serializers.CharField()),
            required=False,
            help_text="Every bad field with its messages.",
        )
        return fields


class BudgetRefusalSerializer(serializers.Serializer):
    """The budget that refused (``error.budget``), as ``BudgetExceeded.wire`` lays it out."""

    def get_fields(self) -> dict[str, serializers.Field]:
        return {
            wire.where[1]: _wire_field(wire, nested=True)
            for wire in BudgetExceeded.wire
            if wire.where[0] == "budget"
        }


class ErrorSerializer(serializers.Serializer):
    error = ErrorDetailSerializer()


class BudgetExceededDetailSerializer(ErrorDetailSerializer):
    budget = BudgetRefusalSerializer(required=False, help_text="Absent when throttled.")


class BudgetExceededSerializer(serializers.Serializer):
    error = BudgetExceededDetailSerializer()


@functools.cache
def _template(serializer_class: type[serializers.Serializer]) -> serializers.Serializer:
    return serializer_class()


def represent(serializer_class: type[serializers.Serializer], instance: Any) -> dict[str, Any]:
    """``serializer_class(instance).data``, from one instance of the serializer per class: a
    ModelSerializer builds its fields from the model on every instance, which costs more than
    the rendering. For read-only output serializers without context (no request-dependent
    fields); rendering changes no state of the serializer or its fields."""
    return dict(_template(serializer_class).to_representation(instance))


_bound_fields = threading.local()


def validating(serializer_class: type[serializers.Serializer], data: Any) -> serializers.Serializer:
    """``serializer_class(data=data)`` whose fields are this thread's bound copy, built once
    per class and thread: binding fields costs more than validating a small body. Validation
    stores its results on the serializer, never on its fields (DRF's fields keep no state from
    a call; ours neither), and a thread validates one body at a time. Only for serializers
    built from ``data`` alone: the fields' root is a template without context or ``partial``."""
    cache = _bound_fields.__dict__.setdefault("by_class", {})
    fields = cache.get(serializer_class)
    if fields is None:
        fields = cache[serializer_class] = serializer_class().fields
    serializer = serializer_class(data=data)
    serializer.__dict__["fields"] = fields  # what the ``fields`` cached_property would hold
    return serializer
