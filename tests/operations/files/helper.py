#!/usr/bin/env python3
print("a helper")
