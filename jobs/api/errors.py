"""Every API error is a JSON object; validation errors are keyed by the field that is wrong."""

from rest_framework.views import exception_handler


def field_naming_exception_handler(exc, context):
    response = exception_handler(exc, context)
    if response is not None and isinstance(response.data, list):
        response.data = {"non_field_errors": response.data}
    return response
