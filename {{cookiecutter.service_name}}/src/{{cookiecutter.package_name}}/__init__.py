"""{{ cookiecutter.description }}"""
