from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/llm-budgets/v1/", include("llm_budgets.api.urls")),
]
