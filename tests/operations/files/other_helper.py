#!/usr/bin/env python3
print("another helper")
