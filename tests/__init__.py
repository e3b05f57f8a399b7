"""The test suite.

Naming: ``test_<area>[_<aspect>].py``, the area first, so one area's files sort together
(``test_admin_*``, ``test_api_*``, ``test_client_*``, ``test_conf_*``, ``test_pricing_*``).
Modules without the ``test_`` prefix are shared helpers (``factories``, ``api``, ``concurrency``,
``queries``, ``services``).
"""
