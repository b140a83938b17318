//! The RLS v3 front door: its YAML, its decisions on every store, and its gRPC service.

mod config;
mod decide;
mod grpc;
