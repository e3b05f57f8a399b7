"""Request and response shapes. Requests are strict: an unknown field is a 400 naming it.

Money is a decimal string in both directions (``"30"``, ``"0.0004"``); a JSON float is refused,
as everywhere in this app. Serializers check shapes only; the services check meaning.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from llm_budgets import validation
from llm_budgets.exceptions import InvalidUsage
from llm_budgets.models import Budget, Price, Reservation, Window
from llm_budgets.money import DECIMAL_PLACES, MAX_DIGITS

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


def money_out(**kwargs: Any) -> serializers.DecimalField:
    """A read-only amount, normalized (``"30"``, not ``"30.0000000000"``)."""
    return serializers.DecimalField(
        max_digits=MAX_DIGITS,
        decimal_places=DECIMAL_PLACES,
        normalize_output=True,
        read_only=True,
        **kwargs,
    )


class StrictSerializer(serializers.Serializer):
    """Refuses fields it does not know, so a typo is an error, not a silent default."""

    # Fields clients may expect from the spec that are not supported yet: the message says why.
    not_yet: dict[str, str] = {}

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError(
                    {name: [self.not_yet.get(name, f"Unknown field {name!r}.")] for name in unknown}
                )
        return super().to_internal_value(data)


def idempotency_key_field() -> serializers.CharField:
    return serializers.CharField(
        required=False,
        max_length=255,
        help_text="Same as the Idempotency-Key header (send either).",
    )


class ReserveRequestSerializer(StrictSerializer):
    not_yet = {
        "messages": "messages is not supported yet: send input_tokens (the prompt's token count).",
        "tags": "tags are not supported yet.",
    }

    tenant = serializers.CharField(
        required=False,
        max_length=255,
        help_text="The tenant's external id. Implied by a tenant key; required with an operator "
        "key.",
    )
    end_user = serializers.CharField(required=False, allow_null=True, max_length=255)
    provider = serializers.CharField(
        required=False,
        allow_null=True,
        max_length=64,
        help_text="May be left out when exactly one provider prices the model.",
    )
    model = serializers.CharField(max_length=128)
    input_tokens = serializers.IntegerField(min_value=0)
    max_output_tokens = serializers.IntegerField(
        min_value=1,
        required=False,
        allow_null=True,
        help_text="Output ceiling; may be omitted only if the tenant's plan sets a default.",
    )
    ttl_seconds = serializers.IntegerField(
        min_value=1, required=False, help_text="Hold lifetime; default DEFAULT_TTL_SECONDS."
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
            "idempotency_key",
            "created_at",
            "expires_at",
            "settled_at",
        ]
        read_only_fields = fields


class CommitRequestSerializer(StrictSerializer):
    input_tokens = serializers.IntegerField(min_value=0)
    output_tokens = serializers.IntegerField(min_value=0)
    cached_input_tokens = serializers.IntegerField(
        min_value=0, required=False, default=0, help_text="How many of input_tokens were cached."
    )
    idempotency_key = idempotency_key_field()


class CommitResultSerializer(serializers.Serializer):
    id = serializers.UUIDField(source="reservation_id", read_only=True)
    state = serializers.CharField(read_only=True)
    cost = money_out(help_text="What the call cost, at the reservation's price version.")
    reserved = money_out()
    overage = money_out(help_text="Cost above the hold; zero when the hold covered it.")
    currency = serializers.CharField(read_only=True)


class EmptyRequestSerializer(StrictSerializer):
    idempotency_key = idempotency_key_field()


class ExtendRequestSerializer(StrictSerializer):
    ttl_seconds = serializers.IntegerField(
        min_value=1, help_text="The hold now expires this many seconds from now (never earlier)."
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
    period_start = serializers.DateTimeField(read_only=True)
    resets_at = serializers.DateTimeField(read_only=True, allow_null=True)


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
    limit = money_out()

    class Meta:
        model = Budget
        fields = [
            "id",
            "scope",
            "scope_label",
            "tenant",
            "end_user",
            "window",
            "limit",
            "currency",
            "updated_at",
        ]
        read_only_fields = fields


class SetLimitRequestSerializer(StrictSerializer):
    tenant = serializers.CharField(
        required=False, max_length=255, help_text="Omit for the global cap."
    )
    end_user = serializers.CharField(
        required=False, max_length=255, help_text='"*" for the default of each end user.'
    )
    window = serializers.ChoiceField(choices=Window.choices)
    amount = MoneyField()
    reason = serializers.CharField(required=False, default="", allow_blank=True, max_length=1000)
    idempotency_key = idempotency_key_field()


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


class ErrorDetailSerializer(serializers.Serializer):
    code = serializers.CharField(help_text="Machine-readable, e.g. budget_exceeded.")
    message = serializers.CharField(help_text="What happened and what to do, for a person.")
    field = serializers.CharField(required=False, help_text="The bad field, when one is.")

    def get_fields(self) -> dict[str, serializers.Field]:
        # "fields" cannot be a class attribute: it would shadow Serializer.fields.
        fields = super().get_fields()
        fields["fields"] = serializers.DictField(
            child=serializers.ListField(child=serializers.CharField()),
            required=False,
            help_text="Every bad field with its messages.",
        )
        return fields


class BudgetRefusalSerializer(serializers.Serializer):
    id = serializers.IntegerField(allow_null=True)
    scope = serializers.CharField()
    window = serializers.CharField()
    limit = serializers.CharField()
    remaining = serializers.CharField()
    currency = serializers.CharField()
    resets_at = serializers.DateTimeField(allow_null=True)


class ErrorSerializer(serializers.Serializer):
    error = ErrorDetailSerializer()


class BudgetExceededDetailSerializer(ErrorDetailSerializer):
    budget = BudgetRefusalSerializer(required=False, help_text="Absent when throttled.")
    requested = serializers.CharField(required=False)


class BudgetExceededSerializer(serializers.Serializer):
    error = BudgetExceededDetailSerializer()
