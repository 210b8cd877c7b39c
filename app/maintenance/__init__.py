"""Background maintenance: one class per loop, run by one shared supervisor on the elected leader."""
