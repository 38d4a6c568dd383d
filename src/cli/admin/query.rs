//! `twinhub query "SELECT …"`: runs an IoT Hub query and follows its continuation tokens.

use clap::{Args, ValueEnum};
use serde_json::{json, Value};

use super::{cell, print_line, print_table, resolve, API, TIMEOUT};
use crate::cli::remote::{RemoteError, Target};

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// An aligned table, one column per top-level field (printed once every page is in)
    Table,
    /// One JSON document per line, printed page by page
    Json,
}

#[derive(Args, Debug)]
pub struct QueryArgs {
    /// The query, e.g. "SELECT * FROM devices WHERE tags.site = 'b43'"
    pub query: String,
    #[arg(long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// Results per request (x-ms-max-item-count)
    #[arg(long, default_value_t = 100)]
    pub page_size: u32,
    /// Stop after this many results
    #[arg(long)]
    pub max: Option<usize>,
    #[command(flatten)]
    pub target: Target,
}

pub async fn main(a: QueryArgs) -> Result<(), RemoteError> {
    if !(1..=1000).contains(&a.page_size) {
        return Err(RemoteError::Usage(format!("--page-size must be from 1 to 1000, got {}", a.page_size)));
    }
    let r = resolve(&a.target)?;
    let body = json!({"query": a.query}).to_string().into_bytes();
    let path = format!("/devices/query?api-version={API}");
    let mut continuation: Option<String> = None;
    let mut rows: Vec<Value> = Vec::new();
    let mut count = 0usize;
    loop {
        let mut headers = vec![("x-ms-max-item-count", a.page_size.to_string())];
        if let Some(c) = &continuation {
            headers.push(("x-ms-continuation", c.clone()));
        }
        let (h, page) = r.call(hyper::Method::POST, &path, &headers, body.clone(), TIMEOUT).await?;
        let page = match page {
            Value::Array(items) => items,
            other => return Err(RemoteError::Invalid(format!("a query page is not an array: {other}"))),
        };
        for item in page {
            if a.max.is_some_and(|m| count >= m) {
                break;
            }
            count += 1;
            match a.output {
                Output::Json => {
                    if !print_line(&item) {
                        return Ok(());
                    }
                }
                Output::Table => rows.push(item),
            }
        }
        continuation =
            h.get("x-ms-continuation").and_then(|v| v.to_str().ok()).filter(|v| !v.is_empty()).map(str::to_string);
        if continuation.is_none() || a.max.is_some_and(|m| count >= m) {
            break;
        }
    }
    if a.output == Output::Table {
        table(&rows);
    }
    eprintln!("{count} result{}", if count == 1 { "" } else { "s" });
    Ok(())
}

/// Columns are the top-level fields in order of first appearance; a bare value is one `value` column.
fn table(rows: &[Value]) {
    let mut columns: Vec<String> = Vec::new();
    for r in rows {
        match r {
            Value::Object(o) => {
                for k in o.keys() {
                    if !columns.contains(k) {
                        columns.push(k.clone());
                    }
                }
            }
            _ if !columns.iter().any(|c| c == "value") => columns.push("value".into()),
            _ => {}
        }
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            columns
                .iter()
                .map(|c| {
                    if r.is_object() {
                        cell(&r[c.as_str()])
                    } else if c == "value" {
                        cell(r)
                    } else {
                        String::new()
                    }
                })
                .collect()
        })
        .collect();
    let names: Vec<&str> = columns.iter().map(String::as_str).collect();
    print_table(&names, &cells);
}
