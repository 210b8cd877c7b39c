"""Long-poll wake-ups across instances: the control connection (LISTEN, coalesced NOTIFY, leader
lock) and the backstop that finds jobs whose wake-up was lost."""
