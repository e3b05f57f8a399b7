"""Every error says whose fault it is (``llm_budgets.exceptions.Fault``), and its HTTP answer
follows: the caller's or the tenant's state a 4xx, a dependency's a 5xx with ``Retry-After``,
ours a 500 (issue #38). The family is discovered (every module of the app imported, every
subclass of ``BudgetError`` walked), never listed by hand, so a new class that declares no fault
of its own, or maps to the wrong kind of status, fails here."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

import pytest

import llm_budgets
from llm_budgets import moved
from llm_budgets.api.exceptions import (
    FAULT_STATUSES,
    STATUS_BY_CODE,
    exception_handler,
    status_for,
)
from llm_budgets.exceptions import BudgetError, Fault, PaymentProviderError


def _every_module() -> None:
    """Import every module of the app (migrations and the aliases of moved modules aside), so
    every error class exists."""
    for info in pkgutil.walk_packages(llm_budgets.__path__, "llm_budgets."):
        if ".migrations" not in info.name and info.name not in moved.MOVED:
            importlib.import_module(info.name)


def every_error_class() -> list[type[BudgetError]]:
    _every_module()
    found: list[type[BudgetError]] = []
    pending: list[type[BudgetError]] = [BudgetError]
    while pending:
        cls = pending.pop(0)
        if cls not in found:
            found.append(cls)
        pending.extend(cls.__subclasses__())
    # The app's own classes; a test's local subclass (a host's, say) is not the app's to decide.
    return [cls for cls in found if cls.__module__.split(".")[0] == "llm_budgets"]


def bare(cls: type[BudgetError]) -> BudgetError:
    """An instance of ``cls`` as its class declares it, without its own ``__init__`` (each takes
    other arguments): what the family test needs is what the class says."""
    exc = cls.__new__(cls)
    BudgetError.__init__(exc, f"a {cls.__name__}")
    return exc


def answer(exc: BudgetError) -> Any:
    return exception_handler(exc, {"request": None})


def test_the_family_is_discovered() -> None:
    names = {cls.__name__ for cls in every_error_class()}
    # Classes from modules beyond exceptions.py are found too (they are imported by the walk).
    assert {"LedgerUnavailable", "PaymentProviderError", "ApiError", "NotGuarded"} <= names
    assert {"WebhookSignatureError", "WebhookPayloadError"} <= names
    assert len(names) >= 20


@pytest.mark.parametrize("cls", every_error_class(), ids=lambda cls: cls.__name__)
def test_every_error_declares_whose_fault_it_is(cls: type[BudgetError]) -> None:
    """Declared on the class itself: a subclass whose parent's fault would fit still says so,
    as PaymentProviderError inheriting InvalidUsage's (the caller's) was the bug."""
    assert "fault" in cls.__dict__, f"{cls.__module__}.{cls.__name__} declares no fault"
    assert isinstance(cls.__dict__["fault"], Fault)


@pytest.mark.parametrize("cls", every_error_class(), ids=lambda cls: cls.__name__)
def test_every_error_is_answered_as_its_fault_says(cls: type[BudgetError]) -> None:
    exc = bare(cls)
    response = answer(exc)
    fault = cls.__dict__.get("fault", exc.fault)
    assert response.status_code == status_for(exc)
    if fault in (Fault.CALLER, Fault.TENANT_STATE):
        assert 400 <= response.status_code < 500, (cls.__name__, response.status_code)
    elif fault is Fault.DEPENDENCY:
        assert response.status_code in (502, 503, 504), (cls.__name__, response.status_code)
        assert int(response.headers["Retry-After"]) >= 1, cls.__name__
        assert response.data["error"]["retry_after"] == int(response.headers["Retry-After"])
    else:
        assert response.status_code == 500, (cls.__name__, response.status_code)
    assert response.data["error"]["code"] == exc.code


def test_the_status_table_agrees_with_each_codes_fault() -> None:
    """A status in ``STATUS_BY_CODE`` outside its class's fault is refused here, not silently
    replaced by ``status_for``."""
    faults = {
        cls.__dict__["code"]: cls.fault for cls in every_error_class() if "code" in cls.__dict__
    }
    for code, status in STATUS_BY_CODE.items():
        if code in faults:
            assert status in FAULT_STATUSES[faults[code]], (code, status, faults[code])


def test_a_payment_provider_failure_is_a_503_with_retry_after() -> None:
    """Stripe unreachable or refusing during a top-up was a 400 (an InvalidUsage): the caller
    was told the request was wrong. It is a dependency's: 503, Retry-After, no bad field."""
    exc = PaymentProviderError("Stripe did not create the Checkout session: down.")
    response = answer(exc)
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "10"
    assert response.data["error"] == {
        "code": "payment_provider_error",
        "message": "Stripe did not create the Checkout session: down.",
        "retry_after": 10,
    }
    assert not isinstance(exc, ValueError)  # no longer caught as the caller's bad input


def test_a_dependency_class_under_a_callers_parent_gets_its_faults_status() -> None:
    """``status_for`` never answers a dependency's error with the status its parent's code maps
    to (the walk up the hierarchy that made PaymentProviderError a 400)."""
    from llm_budgets.exceptions import InvalidUsage

    class HostGatewayDown(InvalidUsage):
        code = "host_gateway_down"
        fault = Fault.DEPENDENCY
        retry_after = 4

    response = answer(HostGatewayDown("the host's gateway is down"))
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "4"


def test_the_clients_api_error_takes_its_fault_from_the_status() -> None:
    from llm_budgets.client import ApiError

    assert ApiError("x", status_code=502, code="http_error").fault is Fault.DEPENDENCY
    assert ApiError("x", status_code=403, code="permission_denied").fault is Fault.CALLER
