"""Mixed plans: each region its own family over one tensor group (docs/mixed_plans.md)."""
