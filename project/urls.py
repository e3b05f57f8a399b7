from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/llm-budgets/v1/", include("llm_budgets.api.urls")),
    path("usage/", include("llm_budgets.pages.urls")),
    # The tenant pages send anonymous visitors to settings.LOGIN_URL.
    path("accounts/", include("django.contrib.auth.urls")),
]
