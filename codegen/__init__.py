"""v4serve code generator: specs/*.yaml -> generated/<spec>/.

Stages, each in its own module:
    load (yaml_loader, schema)  ->  check (invariants)  ->  plan (plan)
    ->  render (render, templates/)  ->  write (writer)
pipeline runs them; cli is `v4serve codegen` and `v4serve spec new` (spec_new).
Importing the package imports none of them.
"""
