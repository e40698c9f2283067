# Generated from serializer/schema.fbs by serializer/regenerate.py. Do not edit.
