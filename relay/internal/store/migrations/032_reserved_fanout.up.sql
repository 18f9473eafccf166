-- Reserved for fan-out's step (issue 52, branch fanout), which is being
-- written beside this branch: Migrations() allows no gap, and ops's step
-- is 033. DELETE THIS FILE when fan-out's 032 merges.
SELECT 1;
