package main

// stosb zeroes b with one REP STOSB (stosb_amd64.s).
//
//go:noescape
func stosb(b []byte)
