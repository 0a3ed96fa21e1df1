//! The built book must work with no network: no page may load a stylesheet, script, font or
//! image from another host (KaTeX's stylesheet once came from a CDN, and with no network the
//! math rendered broken). Links a reader may follow (`<a href>`) are fine.

use std::path::Path;

use anyhow::{Context, Result};

/// Tags whose `src` or `href` the browser fetches by itself.
const LOADING_TAGS: [&str; 9] = ["script", "link", "img", "iframe", "source", "video", "audio", "embed", "object"];

/// Every remote load in the built book under `dir`: `FILE: what it loads`.
pub fn remote_loads(dir: &Path) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    for file in files(dir)? {
        let is_html = file.extension().is_some_and(|e| e == "html");
        let is_css = file.extension().is_some_and(|e| e == "css");
        if !is_html && !is_css {
            continue;
        }
        let text = std::fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?;
        let mut found = css_urls(&text);
        if is_html {
            found.extend(loaded_by_tags(&text));
        }
        let name = file.strip_prefix(dir).unwrap_or(&file).display().to_string();
        problems.extend(found.into_iter().filter(|url| is_remote(url)).map(|url| format!("{name} loads {url}")));
    }
    Ok(problems)
}

fn is_remote(url: &str) -> bool {
    let url = url.trim().trim_matches(|c| c == '"' || c == '\'');
    url.starts_with("http:") || url.starts_with("https:") || url.starts_with("//")
}

/// The `src` and `href` values of [`LOADING_TAGS`].
fn loaded_by_tags(html: &str) -> Vec<String> {
    let mut urls = Vec::new();
    for (start, _) in html.match_indices('<') {
        let tag = &html[start + 1..];
        let tag = &tag[..tag.find('>').unwrap_or(tag.len())];
        let name: String = tag.chars().take_while(|c| c.is_ascii_alphanumeric()).collect();
        if !LOADING_TAGS.contains(&name.to_ascii_lowercase().as_str()) {
            continue;
        }
        for attribute in [" src=", " href=", " data="] {
            if let Some(at) = tag.find(attribute) {
                let value = &tag[at + attribute.len()..];
                let quote = value.chars().next().filter(|c| *c == '"' || *c == '\'');
                let value = match quote {
                    Some(q) => value[1..].split(q).next().unwrap_or(""),
                    None => value.split_whitespace().next().unwrap_or(""),
                };
                urls.push(value.to_string());
            }
        }
    }
    urls
}

/// Every `url(…)` and `@import` in CSS (or in an HTML page's inline styles).
fn css_urls(text: &str) -> Vec<String> {
    let mut urls: Vec<String> = text
        .match_indices("url(")
        .map(|(start, _)| text[start + 4..].split(')').next().unwrap_or("").to_string())
        .collect();
    urls.extend(
        text.match_indices("@import")
            .map(|(start, _)| text[start + 7..].split(';').next().unwrap_or("").trim().to_string()),
    );
    urls
}

fn files(dir: &Path) -> Result<Vec<std::path::PathBuf>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            found.extend(files(&path)?);
        } else {
            found.push(path);
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_remote_stylesheets_scripts_and_fonts_but_not_links() {
        let dir = tempfile::tempdir().unwrap();
        let page = r#"<html><head>
            <link rel="stylesheet" href="https://cdn.jsdelivr.net/npm/katex@0.16.4/dist/katex.min.css">
            <link rel="stylesheet" href="katex/katex.min.css">
            <script src='//example.com/x.js'></script><script src="book.js"></script>
            </head><body><a href="https://github.com/">a link is fine</a>
            <code>&lt;script src="https://not.loaded/"&gt;</code></body></html>"#;
        std::fs::write(dir.path().join("page.html"), page).unwrap();
        std::fs::create_dir(dir.path().join("css")).unwrap();
        let css = "@font-face{src:url(fonts/a.woff2) format(\"woff2\"),url(https://fonts.example/b.woff)}";
        std::fs::write(dir.path().join("css/style.css"), css).unwrap();
        let mut problems = remote_loads(dir.path()).unwrap();
        problems.sort();
        assert_eq!(
            problems,
            [
                "css/style.css loads https://fonts.example/b.woff",
                "page.html loads //example.com/x.js",
                "page.html loads https://cdn.jsdelivr.net/npm/katex@0.16.4/dist/katex.min.css",
            ]
        );
    }
}
