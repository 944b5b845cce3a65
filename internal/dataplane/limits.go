package dataplane

// Limits of the rule processor, generated from enum santa_limit in bpf/santa.h.
const (
	MaxRegions   = int(santaSantaLimitSANTA_MAX_REGIONS)    // regions hashed per rule set
	MaxConds     = int(santaSantaLimitSANTA_MAX_CONDS)      // conditions per rule
	MaxCopies    = int(santaSantaLimitSANTA_MAX_COPIES)     // copy segments per rule, after flattening
	MaxCopyMask  = int(santaSantaLimitSANTA_MAX_COPY_MASK)  // bytes of one masked copy
	MaxGuards    = int(santaSantaLimitSANTA_MAX_GUARDS)     // guards per rule
	GuardSlots   = int(santaSantaLimitSANTA_GUARD_SLOTS)    // slots of the guard map
	MaxChain     = int(santaSantaLimitSANTA_MAX_CHAIN)      // rules per bucket chain
	ReqWindow    = int(santaSantaLimitSANTA_REQ_WINDOW)     // request bytes the matcher sees
	MaxPattern   = int(santaSantaLimitSANTA_MAX_PATTERN)    // bytes in one condition pattern
	MaxRegionLen = int(santaSantaLimitSANTA_MAX_REGION_LEN) // bytes hashed for one region
	MaxReply     = int(santaSantaLimitSANTA_MAX_REPLY)      // UDP payload bytes of a reply over IPv4
	MaxReplyIPv6 = MaxReply - 20                            // the same frame carries 20 bytes less over IPv6
	MaxTCPReply  = int(santaSantaLimitSANTA_MAX_TCP_REPLY)  // TCP reply bytes: an initial window of segments
	MaxSample    = int(santaSantaLimitSANTA_SAMPLE_MAX)     // request bytes in one miss sample
	pageData     = int(santaSantaLimitSANTA_PAGE_DATA)
	pageSlack    = int(santaSantaLimitSANTA_PAGE_SLACK)
	flagDisjoint = uint32(santaSantaLimitSANTA_RULESET_DISJOINT)
	condMasked   = uint32(santaSantaLimitSANTA_COND_MASKED)
)

// MaxProcessors is the processors one rule may have: a limit of the control
// plane, which keeps every processor for listings and its journal while
// the rule processor holds the flattened template (overlapping puts would
// otherwise let a rule hold far more memory in santad than it is charged).
const MaxProcessors = 64
