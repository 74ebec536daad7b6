"""The {{ cookiecutter.service_name }} detector service (see README.md)."""
