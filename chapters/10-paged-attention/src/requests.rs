//! The requests to serve: prompts from the command line, or a workload from a file of
//! JSON lines, one request per line:
//!
//! ```text
//! {"prompt": "Write a haiku about Rust.", "max_new_tokens": 64, "system": "Be brief."}
//! ```
//!
//! `max_new_tokens` and `system` are optional (the default budget, 128, and `--system` apply
//! where they are missing); blank lines are skipped. A line that is not such an
//! object is reported with its number, and nothing runs.

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::Deserialize;

/// One request as the user wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestText {
    pub prompt: String,
    pub max_new_tokens: Option<usize>,
    pub system: Option<String>,
}

/// One request, ready to run: its prompt in the chat format, as token ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub max_new_tokens: usize,
}

// ANCHOR: parse_prompts_file
/// The requests of a prompts file's text (`name` is the file, for the messages).
pub fn parse_prompts_file(name: &str, text: &str) -> Result<Vec<RequestText>> {
    let mut requests = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let request: RequestText = serde_json::from_str(line).with_context(|| {
            format!(
                "{name} line {}: not a request (one JSON object per line: {{\"prompt\": \"...\", \"max_new_tokens\": 64, \"system\": \"...\"}})",
                index + 1
            )
        })?;
        if request.prompt.trim().is_empty() {
            bail!("{name} line {}: the prompt is empty", index + 1);
        }
        requests.push(request);
    }
    if requests.is_empty() {
        bail!("{name} holds no requests");
    }
    Ok(requests)
}
// ANCHOR_END: parse_prompts_file

pub fn read_prompts_file(path: &Path) -> Result<Vec<RequestText>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read the prompts file {}", path.display()))?;
    parse_prompts_file(&path.display().to_string(), &text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_line_is_a_request_with_optional_budget_and_system() {
        let text = "{\"prompt\": \"Hi\"}\n\n{\"prompt\": \"Go\", \"max_new_tokens\": 5, \"system\": \"Be brief.\"}\n";
        let requests = parse_prompts_file("w.jsonl", text).unwrap();
        assert_eq!(requests[0], RequestText { prompt: "Hi".into(), max_new_tokens: None, system: None });
        assert_eq!(requests[1].max_new_tokens, Some(5));
        assert_eq!(requests[1].system.as_deref(), Some("Be brief."));
    }

    #[test]
    fn a_bad_line_is_reported_with_its_number() {
        let mut lines: Vec<String> = (0..6).map(|i| format!("{{\"prompt\": \"request {i}\"}}")).collect();
        lines.push("{\"prompt\": \"unfinished\"".into());
        let error = format!("{:#}", parse_prompts_file("w.jsonl", &lines.join("\n")).unwrap_err());
        assert!(error.starts_with("w.jsonl line 7: not a request"), "{error}");
        let error = format!("{:#}", parse_prompts_file("w.jsonl", "{\"prompt\": \"x\", \"budget\": 3}").unwrap_err());
        assert!(error.contains("line 1") && error.contains("unknown field `budget`"), "{error}");
        let error = parse_prompts_file("w.jsonl", "{\"prompt\": \"x\", \"max_new_tokens\": -1}").unwrap_err();
        assert!(format!("{error:#}").contains("line 1"));
        assert!(parse_prompts_file("w.jsonl", "{\"prompt\": \" \"}").unwrap_err().to_string().contains("empty"));
        assert!(parse_prompts_file("w.jsonl", "\n\n").unwrap_err().to_string().contains("no requests"));
    }
}
