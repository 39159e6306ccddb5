"""Model code as other repositories write it (``examples/new_user_models.py``)."""
