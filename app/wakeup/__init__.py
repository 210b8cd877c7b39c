"""Long-poll wake-ups: in-process waiters, one control connection per instance (LISTEN, coalesced
NOTIFY, leader lock), and the promoter that announces delayed jobs as they come due."""
