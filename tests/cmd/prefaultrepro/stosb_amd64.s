#include "textflag.h"

// func stosb(b []byte)
//
// Zeroes b with one REP STOSB, the instruction the kernel's clear_page_erms
// runs on every 4 KiB page it clears.
TEXT ·stosb(SB), NOSPLIT, $0-24
	MOVQ	b_base+0(FP), DI
	MOVQ	b_len+8(FP), CX
	XORL	AX, AX
	CLD
	REP;	STOSB
	RET
