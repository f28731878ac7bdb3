"""The HTTP edge: parse, authorize, call a service, render. No policy here."""
